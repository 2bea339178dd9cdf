"""fsdp_config.grad_accumulation in the plan: what each mode keeps between micro-batches, how "auto"
resolves, and that the preflight hands the resolution to the workers (the step plan)."""

from dataclasses import replace

import pytest

from logicrl.config.phases import ARR
from logicrl.memory.phases import GB
from logicrl.memory.planner import plan_inputs
from logicrl.preflight.memory import check_memory
from tests.memory.conftest import inputs, step_plan

# Qwen2.5-7B's parameters; the actor's fp32 gradients are 4 bytes each, sharded over 4 ranks.
N = 7_615_616_512
ONE_PER_MICRO = f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1"  # 16 micro-batches per mini-batch


def _update(x, mode, capacity=1000 * GB):
    return plan_inputs(x.with_model("actor", grad_accum=mode), capacity).phase("update_actor")


def test_sharded_accumulation_keeps_a_quarter_of_the_gradients_on_4_ranks(data):
    _, _, x = inputs(data, ONE_PER_MICRO)
    unsharded, sharded = _update(x, "unsharded"), _update(x, "sharded")
    assert unsharded.moment == sharded.moment == "top"  # the same instant: backward begins
    # Only what the earlier micro-batches left differs: 4n bytes full-size against 4n/4 sharded.
    assert unsharded.parts["grads"] - sharded.parts["grads"] == pytest.approx(4 * N - N, rel=1e-3)
    assert unsharded.parts["activations"] == sharded.parts["activations"]


def test_one_micro_batch_accumulates_nothing_either_way(data):
    _, _, x = inputs(data, f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16")
    assert _update(x, "sharded").parts == _update(x, "unsharded").parts


def test_auto_picks_unsharded_when_it_fits_and_sharded_when_it_does_not(data):
    _, _, x = inputs(data, ONE_PER_MICRO)
    assert x.models["actor"].grad_accum == "auto"  # the default
    assert plan_inputs(x, 1000 * GB).inputs.models["actor"].grad_accum == "unsharded"
    # A device between the two plans' peaks (+ the 1 GB kept free): only sharded fits.
    capacity = (_update(x, "sharded").total + _update(x, "unsharded").total) // 2 + GB
    plan = plan_inputs(x, capacity)
    assert plan.inputs.models["actor"].grad_accum == "sharded"
    assert plan.phase("update_actor").total == _update(x, "sharded", capacity).total
    # One rank has nothing to shard.
    assert plan_inputs(replace(x, world=1), capacity).inputs.models["actor"].grad_accum == "unsharded"


def test_preflight_hands_the_resolved_mode_to_the_workers(data):
    _, _, x = inputs(data, ONE_PER_MICRO)
    between = ((_update(x, "sharded").total + _update(x, "unsharded").total) / 2 + GB) / GB
    for gpu_gb, mode in ((between, "sharded"), (1000, "unsharded")):
        cfg, spec, plan = step_plan(data, ONE_PER_MICRO, f"trainer.gpu_memory_gb={gpu_gb}")
        assert plan.actor.grad_accumulation == "auto" and not plan.actor.sharded_grads
        planned = check_memory(cfg, spec, plan).plan
        assert planned.actor.grad_accumulation == mode and planned.actor.sharded_grads == (mode == "sharded")
    # Named in the config, it is kept even where unsharded would fit.
    cfg, spec, plan = step_plan(data, ONE_PER_MICRO, "trainer.gpu_memory_gb=1000",
                                f"{ARR}.actor.fsdp_config.grad_accumulation=sharded")
    assert check_memory(cfg, spec, plan).plan.actor.grad_accumulation == "sharded"
