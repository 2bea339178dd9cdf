"""Set-up the memory tests share: the Qwen2.5-7B shape config (no weights), its GRPO run on 4 GPUs, and
the plan's inputs of a composed config as the preflight builds them."""

from logicrl.config import compose, validate
from logicrl.config.phases import ARR
from logicrl.memory.planner_inputs import PlanInputs
from tests.conftest import ROOT

QWEN7B = ROOT / "logicrl/memory/shapes/qwen2.5-7b"
# GRPO with a KL loss on 4 GPUs: 8 prompts x 16 = 128 responses, 32 per rank; per-rank mini-batch 16.
GRPO_7B = [f"{ARR}.model.path={QWEN7B}", "algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=true",
           "trainer.n_gpus=4", "trainer.device=cuda", "data.train_batch_size=8", f"{ARR}.rollout.n=16",
           f"{ARR}.actor.ppo_mini_batch_size=4", "data.max_prompt_length=512", "data.max_response_length=2048",
           f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16", f"{ARR}.rollout.name=vllm",
           f"{ARR}.model.use_remove_padding=false", f"{ARR}.model.enable_gradient_checkpointing=false"]


def planned(*overrides: str, device: str = "cuda"):
    """(cfg, spec, step plan, PlanInputs) of the composed, validated config."""
    cfg, spec, plan = validate(compose(list(overrides)))
    return cfg, spec, plan, PlanInputs.from_plan(plan, cfg, spec, device)


def inputs(data, *overrides) -> tuple:
    """GRPO_7B on `data` (the data fixture's overrides): (cfg, spec, PlanInputs)."""
    cfg, spec, _, x = planned(*data, *GRPO_7B, *overrides)
    return cfg, spec, x


def step_plan(data, *overrides):
    """GRPO_7B on `data`, validated: (cfg, spec, step plan)."""
    return validate(compose([*data, *GRPO_7B, *overrides]))
