"""The step loop and what runs around it: rewards, validation, metrics, checkpoints, the curriculum."""
