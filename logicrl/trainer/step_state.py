"""What one step (or one validation pass) gathers while it runs, kept apart from the trainer.

The phases of a step write into its `StepState`: the controller's metrics, each rank's metrics of every
phase it ran (merged into the step's row at its end, trainer/batch.py merge_rank_metrics) and, per
generation round, the tokens each generating rank produced. Nothing of it lives on the trainer, so two
steps can be in flight at once (the next batch generating while this one trains), each with its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepState:
    step: int | None  # None: a validation pass (no test fault fires, nothing is logged under a step)
    metrics: dict = field(default_factory=dict)  # the controller's: timing_s/<phase>, rewards, lengths, ...
    rank_metrics: list[dict] = field(default_factory=list)  # per rank, summed over the step's phase calls
    # Per generation round: each generating rank's response tokens, and every response's length.
    generated: list[tuple[list[int], list[int]]] = field(default_factory=list)

    def add_rank_metrics(self, per_rank: list[dict]) -> None:
        """Each rank's metrics of one phase call into its step total: a phase called more than once (dynamic
        sampling's generation rounds) sums its times and keeps its highest memory peak."""
        if not self.rank_metrics:
            self.rank_metrics = [{} for _ in per_rank]
        for total, m in zip(self.rank_metrics, per_rank):
            for key, value in m.items():
                if key.startswith("timing_s/") and key in total:
                    total[key] += value
                elif key.startswith("perf/memory/") and key in total:
                    total[key] = max(total[key], value)
                else:
                    total[key] = value

    def rank_times(self, phase: str) -> list[float]:
        """Each rank's own time in `phase` this step (0 where it did not run it)."""
        return [m.get(f"timing_s/{phase}", 0.0) for m in self.rank_metrics]
