"""Rollout engines: one interface (base.RolloutEngine), one implementation per backend.

`vllm` (the default) runs a vLLM engine in each rank's process, beside the actor; `hf`
(hf.HFRolloutEngine) samples with a transformers model, and is what `vllm` falls back to where
vLLM does not import (config/engines.py: the engines' table of traits, and resolve_engine). Each holds
its own copy of the policy, synced after every update, and both return the same RolloutOutput,
log-probs included.
"""

from logicrl.workers.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

__all__ = ["RolloutEngine", "RolloutOutput", "SamplingParams"]
