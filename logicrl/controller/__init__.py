"""The single controller's side: the Ray cluster (cluster.py: a private one, or one to join), where the
ranks go (placement.py: spread over nodes, rendezvous on rank 0's node, threads per node) and the
worker group that calls them (worker_group.py)."""
