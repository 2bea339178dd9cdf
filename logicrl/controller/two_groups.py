"""The trainer group and the rollout group behind one group's interface (`actor_rollout_ref.hybrid_engine=false`).

The step loop calls a group's `call`/`dispatch` (and their `_async` forms) with a phase name; a phase whose
model is the engine (config/phases.py) goes to the rollout ranks, every other call (the model phases,
checkpoints, resume) to the trainer ranks. Calls that need both groups at once, the weight sync and the weight
group's set-up, are issued by trainer/one_step_off.py on `trainer` and `rollout` directly.
"""

from __future__ import annotations

from typing import Any

from logicrl.config.phases import phase as phase_row
from logicrl.controller.pending import Pending


class TwoGroups:
    def __init__(self, trainer, rollout):
        self.trainer, self.rollout = trainer, rollout

    def __len__(self) -> int:
        return len(self.trainer)

    def group_for(self, method: str, kwargs: dict):
        phase = kwargs.get("phase") if method == "run" else None
        return self.rollout if phase is not None and phase_row(phase).model == "engine" else self.trainer

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        return self.group_for(method, kwargs).call(method, *args, **kwargs)

    def dispatch(self, method: str, shards: list, **kwargs: Any) -> list:
        return self.group_for(method, kwargs).dispatch(method, shards, **kwargs)

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> Pending:
        return self.group_for(method, kwargs).call_async(method, *args, **kwargs)

    def dispatch_async(self, method: str, shards: list, **kwargs: Any) -> Pending:
        return self.group_for(method, kwargs).dispatch_async(method, shards, **kwargs)

    def shutdown(self) -> None:
        try:
            self.rollout.shutdown()
        finally:
            self.trainer.shutdown()
