"""Separate device groups in the memory plan: the rollout group holds the engine alone, its KV cache a share of
the whole device; the trainer group holds the FSDP2 models and reserves no KV cache; each is checked against
its own device and a refusal names its group. Numbers derived by hand from the models' config.json figures."""

import pytest

from logicrl.config import compose, validate
from logicrl.config.errors import ConfigError
from logicrl.config.phases import ARR
from logicrl.memory.phases import GB
from logicrl.memory.planner import plan_inputs
from logicrl.preflight.memory import check_memory
from tests.conftest import ROOT
from tests.memory.conftest import planned

QWEN05, QWEN7B = ROOT / "logicrl/memory/shapes/qwen2.5-0.5b", ROOT / "logicrl/memory/shapes/qwen2.5-7b"
CAP = 80 * GB
# Qwen2.5-0.5B: 494,032,768 weights; its largest tensor the tied [151936, 896] embedding, 272,269,312 bytes in
# bf16. Every dimension is even, so each of 2 FSDP ranks holds exactly half of every fp32 master.
N, LARGEST, BUCKET = 494_032_768, 151936 * 896 * 2, 512 * 2**20
SPLIT = [f"{ARR}.model.path={QWEN05}", "algorithm.adv_estimator=grpo", "trainer.device=cuda",
         f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.gpu_memory_utilization=0.5", f"{ARR}.actor.use_kl_loss=false",
         f"{ARR}.rollout.update_weights_bucket_mb=512", "trainer.n_gpus=2"]
GROUPS = [f"{ARR}.hybrid_engine=false", "rollout.n_gpus_per_node=2"]


@pytest.fixture
def groups(data_files):
    cfg, spec, plan, x = planned(*data_files, *SPLIT, *GROUPS)
    assert spec.num_params() == N and plan.rollout_ranks == 2
    return (plan_inputs(x.for_group("trainer", plan.ranks), CAP), plan_inputs(x.for_group("rollout", 2), CAP))


def test_the_rollout_group_holds_the_engine_alone_its_kv_cache_a_share_of_the_whole_device(groups):
    _, rollout = groups
    generate = rollout.phase("generate")
    # vLLM takes gpu_memory_utilization of the device for its weights, KV cache and activation reserve (generate's
    # activations): 0.5 x 80 GiB, nothing else.
    assert generate.total == 40 * GB
    assert generate.parts["params"] == generate.parts["optimizer"] == 0
    reserve = generate.parts["activations"]
    assert generate.parts["engine"] + generate.parts["kv_cache"] + reserve == 40 * GB
    # Receiving a sync: the engine's weights and KV cache (its reserve is room its forwards use, not tensors it
    # keeps) and one flat 512 MiB bucket (the payload, 2N bytes, is larger).
    assert rollout.phase("update_weights").total == 40 * GB - reserve + BUCKET
    assert rollout.phase("update_actor").skipped == "on the trainer group"
    # Staleness 1 trains in bypass mode (config/async_training.py): no group runs an old-log-prob pass.
    assert rollout.phase("old_log_prob").skipped.startswith("rollout_correction.bypass_mode")


def test_the_trainer_group_holds_the_models_and_no_engine(groups):
    trainer, _ = groups
    assert trainer.phase("generate").skipped == "on the rollout group"
    for phase in trainer.running():
        assert phase.parts["kv_cache"] == phase.parts["engine"] == 0, phase
    # Between phases: half of the fp32 masters (4N / 2) and half of AdamW's two fp32 states (8N / 2).
    send = trainer.phase("update_weights")
    assert send.parts["optimizer"] == 4 * N
    # Sending: the stream gathers a 512 MiB bucket beside the next tensor (at most the embedding), and rank 0
    # copies the bucket into one flat buffer for the broadcast.
    assert send.parts["params"] == 2 * N + max(2 * LARGEST, BUCKET + LARGEST) + BUCKET
    assert send.total == 6 * N + BUCKET + LARGEST + BUCKET


def test_a_colocated_rank_holds_what_the_two_groups_hold_apart(data_files, groups):
    trainer, rollout = groups
    cfg, spec, plan, x = planned(*data_files, *SPLIT)
    colocated = plan_inputs(x, CAP)
    # Generating, a colocated rank keeps the trainer group's resident state (2N + 4N) beside the same engine.
    assert colocated.phase("generate").total == 2 * N + 4 * N + 40 * GB
    # Training, its vLLM sleeps (CUDA): the same update as the trainer group's.
    assert colocated.phase("update_actor").total == trainer.phase("update_actor").total


def test_a_7b_that_a_colocated_rank_cannot_hold_fits_on_two_groups(data_files):
    model = [f"{ARR}.model.path={QWEN7B}", f"{ARR}.rollout.gpu_memory_utilization=0.9", "trainer.n_gpus=4",
             "trainer.gpu_memory_gb=80", f"{ARR}.model.enable_gradient_checkpointing=true"]
    # Colocated: 7.6B fp32 masters and AdamW states over 4 ranks (22.8 GB) beside vLLM's 72 GB.
    with pytest.raises(ConfigError, match=r"^generate needs 9\d\.\d GB > 79\.0 GB usable per device"):
        check_memory(*validate(compose([*data_files, *SPLIT, *model])))
    stage = check_memory(*validate(compose([*data_files, *SPLIT, *model, f"{ARR}.hybrid_engine=false",
                                            "rollout.n_gpus_per_node=4"])))
    assert stage.rollout.phase("generate").total == int(0.9 * 80 * GB)
    assert stage.memory.phase("generate").skipped == "on the rollout group"
    # A sweep's peaks: each phase from the group that runs it, update_weights the higher of the two.
    assert stage.peaks_gb["generate"] == 72.0
    assert stage.peaks_gb["update_weights"] == round(max(stage.memory.phase("update_weights").total,
                                                         stage.rollout.phase("update_weights").total) / GB, 3)
    assert "== trainer group, 4 device(s)" in stage.table and "== rollout group, 4 device(s)" in stage.table


def test_each_group_is_checked_against_its_own_device_and_named(data_files):
    overrides = [*data_files, *SPLIT, *GROUPS, "trainer.gpu_memory_gb=80", f"{ARR}.rollout.gpu_memory_utilization=0.99"]
    # 0.99 x 80 GiB = 79.2 GiB for the engine as it generates, over the 79 GiB left beside the 1 GiB kept free; a
    # sync received beside its weights and KV cache adds its 0.5 GiB bucket. 0.90 (the largest 0.05 step below)
    # leaves room for both.
    with pytest.raises(ConfigError) as err:
        check_memory(*validate(compose(overrides)))
    assert str(err.value).startswith("the rollout group: generate needs 79.2 GB > 79.0 GB usable per device "
                                     f"(1 other phase(s) too): set {ARR}.rollout.gpu_memory_utilization=0.90")
    # The trainer group, on its own device, fits: only the engine's share was too large.
    assert "the trainer group" not in str(err.value)
