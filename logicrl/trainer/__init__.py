"""The step loop, metrics, validation and (later) checkpoints."""
