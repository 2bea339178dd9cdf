"""The planner's per-model inputs come from the model table (config/models.py): one ModelInputs per role,
read by its row's keys, and the suggestions name and set each model's own key. Qwen2.5-1.5B's shape, PPO
(actor and critic) on 2 x 40 GB."""

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.models import MODELS
from logicrl.config.phases import ARR, WORKER_PHASES
from logicrl.memory.fit import auto_micro_batch, budget_remedy, check_fit
from logicrl.memory.planner import format_table, plan_inputs
from logicrl.preflight.memory import plan_for
from tests.conftest import ROOT

QWEN = ROOT / "logicrl/memory/shapes/qwen2.5-1.5b"
PPO = [f"{ARR}.model.path={QWEN}", "algorithm.adv_estimator=gae", "trainer.n_gpus=2", "trainer.device=cuda",
       "trainer.gpu_memory_gb=40", "data.train_batch_size=8", f"{ARR}.rollout.n=4",
       f"{ARR}.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=4", "data.max_prompt_length=1024",
       "data.max_response_length=4096",
       f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.kv_cache_gb=4", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1",
       f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=1", f"{ARR}.model.enable_gradient_checkpointing=false",
       "critic.model.enable_gradient_checkpointing=false"]


def inputs(data, *overrides):
    cfg, spec, plan = validate(compose([*data, *PPO, *overrides]))
    x, cap, _ = plan_for(cfg, spec, plan)
    return x, cap


def test_each_row_s_keys_reach_its_own_inputs(data):
    x, _ = inputs(data, f"{ARR}.ref.fsdp_config.param_offload=true", "critic.fsdp_config.optimizer_offload=true",
                  "critic.model.enable_gradient_checkpointing=true", f"{ARR}.model.enable_gradient_checkpointing=false")
    assert set(x.models) == {m.name for m in MODELS}
    actor, ref, critic, rm = (x.models[r] for r in ("actor", "ref", "critic", "reward_model"))
    assert ref.offload and not actor.offload and not critic.offload
    assert critic.optim_offload and critic.ckpt and not actor.optim_offload and not actor.ckpt
    # The step plan's updates: 4 prompts x 4 responses over 2 ranks per optimizer step, for both trained roles.
    assert actor.per_rank_mini == critic.per_rank_mini == 8 and ref.per_rank_mini == 1
    assert actor.spec == ref.spec == critic.spec == x.spec and rm.spec is None  # no reward model here
    assert x.holds("critic") and not x.holds("ref") and not x.holds("reward_model")  # no KL term: no reference


def test_the_plan_s_phases_are_the_phase_table_s(data):
    x, cap = inputs(data)
    plan = plan_inputs(x, cap)
    assert [p.name for p in plan.phases] == list(WORKER_PHASES)
    assert plan.phase("reward_model").skipped.startswith("no reward model")
    assert plan.phase("ref").skipped.startswith("no KL term")


def test_a_switch_sets_the_model_whose_row_has_the_key(data):
    x, _ = inputs(data)
    on = x.switch("critic.fsdp_config.param_offload", True)
    assert on.models["critic"].offload and not on.models["actor"].offload and not x.models["critic"].offload
    ckpt = x.switch(f"{ARR}.model.enable_gradient_checkpointing", True)
    assert ckpt.models["actor"].ckpt and not ckpt.models["critic"].ckpt
    with pytest.raises(KeyError, match="no model's switch"):
        x.switch(f"{ARR}.rollout.gpu_memory_utilization", True)


def test_a_padded_critic_beside_a_packed_actor_is_planned_and_advised_by_its_own_key(data):
    x, cap = inputs(data, f"{ARR}.model.use_remove_padding=true", "critic.model.use_remove_padding=false",
                    "critic.ppo_micro_batch_size_per_gpu=8")
    assert x.models["actor"].packing is not None and x.models["critic"].packing is None
    plan = plan_inputs(x, cap)
    assert "; critic padded (sdpa, a [T, T] padding mask per row)" in format_table(plan).splitlines()[1]
    # A token budget bounds memory at any length only over packed rows: the actor's update gets one, the
    # critic's keeps rows.
    picked = auto_micro_batch(x, cap)
    assert f"{ARR}.actor.ppo_max_token_len_per_gpu" in picked and "critic.ppo_max_token_len_per_gpu" not in picked
    # Its budget (one full-length row: 1024 + 4096 tokens), named beside the micro-batch, needs the critic's
    # own use_remove_padding, not the actor's.
    assert plan.phase("update_critic").total > plan.usable
    text, keys = budget_remedy(plan)
    assert text.endswith("critic.use_dynamic_bsz=true critic.ppo_max_token_len_per_gpu=5120 "
                         "critic.model.use_remove_padding=true")
    assert keys[-1] == "critic.model.use_remove_padding"
    with pytest.raises(ConfigError, match="update_critic needs .* set critic.ppo_micro_batch_size_per_gpu=1 or "
                                        "critic.model.enable_gradient_checkpointing=true"):
        check_fit(plan)
