"""The memory plan counts the real reward-model phase from the reward_model group: its shape read from
reward_model.model.path, held like the reference (resident unless param_offload), its forward split by
reward_model.micro_batch_size_per_gpu."""

from dataclasses import replace

import pytest

from logicrl.config import compose, validate
from logicrl.memory.footprint import ModelBytes
from logicrl.memory.planner import plan_inputs
from logicrl.memory.preflight import plan_for
from logicrl.models.spec import load_model_spec
from tests.conftest import ROOT, write_jsonl
from tests.workers.conftest import write_tiny_reward_model

ARR = "actor_rollout_ref"
QWEN7B = ROOT / "logicrl/memory/shapes/qwen2.5-7b"
PPO_7B = [f"{ARR}.model.path={QWEN7B}", "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true",
          "trainer.n_gpus=4", "trainer.device=cuda", "trainer.gpu_memory_gb=80", "data.train_batch_size=8",
          f"{ARR}.rollout.n=4", f"{ARR}.actor.ppo_mini_batch_size=4", "data.max_prompt_length=512",
          "data.max_response_length=1024", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
          "critic.ppo_micro_batch_size_per_gpu=4", f"{ARR}.rollout.name=hf", "trainer.memory_plan=worst_case"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm-plan")
    data = write_jsonl(root / "train.jsonl", 16)
    return [f"data.train_files={data}", f"data.val_files={data}"], write_tiny_reward_model(root / "rm")


def planned(files, *overrides):
    data, rm = files
    cfg, spec, plan = validate(compose([*data, *PPO_7B, "reward_model.enable=true", f"reward_model.model.path={rm}",
                                        *overrides]))
    x, cap, _ = plan_for(cfg, spec, plan)
    return x, plan_inputs(x, cap)


def test_the_phase_runs_with_its_own_micro_batch_and_shape(files):
    x, memory = planned(files, "reward_model.micro_batch_size_per_gpu=2")
    assert x.skip_reward_model is None and (x.reward_micro, x.reward_budget) == (2, None)
    assert x.reward_spec == load_model_spec(str(files[1]))
    rm = memory.phase("reward_model")
    assert not rm.skipped and rm.total > 0
    # The reward model's bf16 shard (a value head, no lm_head) is resident in every phase, as the reference's.
    shard = ModelBytes.build(x.reward_spec, dtype_bytes=2, world=4, head="value").total_shard
    without = plan_inputs(replace(x, reward_spec=None), memory.capacity)
    assert without.phase("reward_model").skipped
    for phase in ("generate", "update_actor", "update_weights"):
        assert memory.phase(phase).parts["params"] - without.phase(phase).parts["params"] == shard, phase
    # Twice the rows per forward: more activations, the same resident state.
    _, bigger = planned(files, "reward_model.micro_batch_size_per_gpu=4")
    assert bigger.phase("reward_model").parts["activations"] > rm.parts["activations"]
    assert bigger.phase("reward_model").parts["params"] == rm.parts["params"]


def test_param_offload_keeps_it_off_the_device_between_phases(files):
    x, memory = planned(files, "reward_model.model.fsdp_config.param_offload=true")
    assert x.reward_offload
    _, resident = planned(files)
    shard = ModelBytes.build(x.reward_spec, dtype_bytes=2, world=4, head="value").total_shard
    assert resident.phase("generate").parts["params"] - memory.phase("generate").parts["params"] == shard


def test_by_tokens_with_use_dynamic_bsz(files):
    x, _ = planned(files, "reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=3072")
    assert (x.reward_micro, x.reward_budget) == (None, 3072)


def test_auto_micro_batch_sizes_its_forward_and_the_plan_takes_the_key(files):
    from logicrl.memory.fit import auto_micro_batch

    data, rm = files
    cfg, spec, plan = validate(compose([*data, *PPO_7B, "reward_model.enable=true", f"reward_model.model.path={rm}",
                                        "reward_model.micro_batch_size_per_gpu=1"]))
    x, cap, _ = plan_for(cfg, spec, plan)
    picked = auto_micro_batch(x, cap)
    # 8 responses per rank, a 64-wide reward model on 80 GB: all 8 in one forward.
    assert picked["reward_model.micro_batch_size_per_gpu"] == 8
    assert plan.with_micro(picked).micro("reward_model").value == 8
