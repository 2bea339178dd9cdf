"""The single controller's side: Ray placement and worker groups."""
