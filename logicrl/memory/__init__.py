"""Memory: per-phase telemetry, the preflight plan (peak bytes per phase, checked before anything
loads; docs/memory.md) and the tracker that checks the plan against measured peaks."""
