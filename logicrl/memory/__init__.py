"""Memory: per-phase telemetry now; the preflight planner and OOM recovery build on it."""
