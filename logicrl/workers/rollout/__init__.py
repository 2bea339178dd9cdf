"""Rollout engines: one interface (base.RolloutEngine), one implementation per backend.

`hf` generates with the training module itself (hf.HFRolloutEngine); `vllm` (issue 6) runs a
vLLM engine colocated with the actor. Both return the same RolloutOutput, log-probs included.
"""

from logicrl.workers.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

__all__ = ["RolloutEngine", "RolloutOutput", "SamplingParams"]
