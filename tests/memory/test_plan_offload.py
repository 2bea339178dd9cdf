"""optimizer_offload in the memory plan: AdamW's states leave the device outside their own update
and are there during it (workers/update.py); on CPU ranks nothing moves."""

from dataclasses import replace

import pytest

from logicrl.config import compose, validate
from logicrl.config.phases import ARR
from logicrl.memory.fit import _flag_knobs
from logicrl.memory.phases import GB
from logicrl.memory.planner import build_models, plan_inputs
from logicrl.memory.planner_inputs import PlanInputs
from tests.conftest import ROOT, write_jsonl

QWEN7B = ROOT / "logicrl/memory/shapes/qwen2.5-7b"
# GAE on 4 GPUs (actor and critic both train), vLLM with a fixed KV cache.
GAE_7B = [f"{ARR}.model.path={QWEN7B}", f"critic.model.path={QWEN7B}", "algorithm.adv_estimator=gae",
          "trainer.n_gpus=4", "trainer.device=cuda", "data.train_batch_size=8", f"{ARR}.rollout.n=4",
          f"{ARR}.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4", "data.max_prompt_length=512",
          "data.max_response_length=1024", f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.kv_cache_gb=4"]


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> PlanInputs:
    data = write_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", 16)
    cfg, spec, plan = validate(compose([f"data.train_files={data}", f"data.val_files={data}", *GAE_7B]))
    return PlanInputs.from_plan(plan, cfg, spec, "cuda", spec)


def both_on(x: PlanInputs, switch: str) -> PlanInputs:
    """`x` with the actor's and the critic's `switch` (a ModelInputs field) on."""
    return x.with_model("actor", **{switch: True}).with_model("critic", **{switch: True})


def test_the_config_keys_reach_the_plan(tmp_path):
    data = write_jsonl(tmp_path / "train.jsonl", 16)
    cfg, spec, plan = validate(compose([f"data.train_files={data}", f"data.val_files={data}", *GAE_7B,
                                        f"{ARR}.actor.fsdp_config.optimizer_offload=true"]))
    x = PlanInputs.from_plan(plan, cfg, spec, "cuda", spec)
    assert x.models["actor"].optim_offload and not x.models["critic"].optim_offload


def test_states_leave_the_device_outside_their_update(plain):
    m = build_models(plain)
    actor_states, critic_states = 2 * m.actor.trainable_shard, 2 * m.critic.trainable_shard
    before = plan_inputs(plain, 80 * GB)
    after = plan_inputs(both_on(plain, "optim_offload"), 80 * GB)
    for name in ("generate", "old_log_prob", "values", "update_weights"):
        assert before.phase(name).parts["optimizer"] == actor_states + critic_states
        assert after.phase(name).parts["optimizer"] == 0
    # Each update brings its own model's states back, and only those.
    assert after.phase("update_actor").parts["optimizer"] - before.phase("update_actor").parts["optimizer"] == \
        -critic_states
    assert after.phase("update_critic").parts["optimizer"] - before.phase("update_critic").parts["optimizer"] == \
        -actor_states
    assert after.phase("generate").total == before.phase("generate").total - actor_states - critic_states


def test_with_param_offload_or_on_cpu_it_moves_nothing_more(plain):
    params = both_on(plain, "offload")
    both = both_on(params, "optim_offload")
    cpu = replace(plain, device="cpu")
    for a, b in ((params, both), (cpu, both_on(cpu, "optim_offload"))):
        assert [p.total for p in plan_inputs(a, 80 * GB).phases] == [p.total for p in plan_inputs(b, 80 * GB).phases]


def test_it_is_suggested_before_parameter_offload_where_it_can_help(plain):
    actor, critic = f"{ARR}.actor.fsdp_config.optimizer_offload", "critic.fsdp_config.optimizer_offload"
    assert [k for k, _ in _flag_knobs(plain, "generate")][:2] == [actor, critic]
    assert actor not in [k for k, _ in _flag_knobs(plain, "update_actor")]
    assert critic not in [k for k, _ in _flag_knobs(plain, "update_critic")]
    # Each suggestion's change is its key's: the switch of that model alone.
    change = dict(_flag_knobs(plain, "generate"))[critic](plain)
    assert change.models["critic"].optim_offload and not change.models["actor"].optim_offload
