"""Memory: the planner (peak bytes per phase from shapes, footprints and lengths, fitting micro-batches;
docs/memory.md), per-phase telemetry and the tracker that checks the plan against measured peaks.
The preflight (logicrl/preflight/) runs the planner before anything loads."""
