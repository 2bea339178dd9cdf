"""The memory plan under Ulysses sequence parallelism (memory/phases.py sequence_parallel, memory/fit.py
sp_remedy): SP divides per-token activations, not weights or optimizer states, and a refusal names the
size that fits. docs/memory.md's sequence-parallel case (its table): Qwen2.5-7B's shape on 4 x 80 GB,
16k-token responses, rollout.n=16, no gradient checkpointing. And trainer.auto_micro_batch's path (preflight
check_memory) on a config only: when no micro-batch or token budget fits, its refusal names the SP size."""

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR
from logicrl.memory.fit import check_fit
from logicrl.memory.phases import sequence_parallel
from logicrl.memory.planner import plan_inputs
from logicrl.preflight.memory import check_memory, plan_for
from tests.conftest import ROOT

QWEN7B = ROOT / "logicrl/memory/shapes/qwen2.5-7b"  # 28 heads, 4 KV heads of 128
SP = f"{ARR}.actor.ulysses_sequence_parallel_size"


def seed_001(data_files, sp: int):
    cfg, spec, plan = validate(compose([
        *data_files, "algorithm.adv_estimator=grpo", "data.train_batch_size=16", "data.max_prompt_length=1024",
        "data.max_response_length=16384",
        f"{ARR}.model.path={QWEN7B}", f"{ARR}.model.use_remove_padding=true",
        f"{ARR}.model.enable_gradient_checkpointing=false", f"{ARR}.actor.ppo_mini_batch_size=16",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1", f"{ARR}.actor.use_kl_loss=true",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=1", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=1",
        f"{ARR}.rollout.n=16", f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.gpu_memory_utilization=0.5",
        "trainer.n_gpus=4", "trainer.gpu_memory_gb=80", "trainer.device=cuda", f"{SP}={sp}"]))
    x, cap, _ = plan_for(cfg, spec, plan)
    return plan_inputs(x, cap)


def test_seed_001_is_refused_at_sp_1_naming_the_size_that_fits(data_files):
    with pytest.raises(ConfigError) as err:
        check_fit(seed_001(data_files, 1))
    assert str(err.value).endswith(f"; or set {SP}=4 (Ulysses sequence parallelism: each row's tokens split "
                                   "over 4 ranks)"), err.value
    with pytest.raises(ConfigError, match=f"; or set {SP}=4 "):
        check_fit(seed_001(data_files, 2))
    check_fit(seed_001(data_files, 4))  # fits


def test_sp_divides_activations_not_weights_or_optimizer(data_files):
    one, four = seed_001(data_files, 1).phase("update_actor"), seed_001(data_files, 4).phase("update_actor")
    for part in ("params", "optimizer"):
        assert four.parts[part] == one.parts[part], part
    assert four.parts["activations"] < one.parts["activations"] / 3  # mostly per-token terms, divided by 4


def test_the_exchange_buffers_by_hand(data_files):
    x = seed_001(data_files, 4).inputs
    s, tokens, local, exchange = sequence_parallel(x, "update_actor", x.spec, 1, None)
    # One full row per micro-batch: 1024 + 16384 tokens, 4352 on each of 4 ranks. q, k, v of the share
    # (28 + 2 x 4 heads of 128, bf16) three times (send, receive, head-major copy), the output (28 heads) too.
    assert (s, tokens, local) == (4, 17408, 4352)
    assert exchange == 3 * 4352 * (28 + 8) * 128 * 2 + 3 * 4352 * 28 * 128 * 2
    assert sequence_parallel(x, "generate", x.spec, 1, None)[0] == 1  # rollout is not split


def test_auto_micro_batch_names_the_sp_size_when_no_micro_batch_fits(data_files):
    # Qwen2.5-7B's shape, 1,024 + 31,744 = 32,768-token rows, gradient checkpointing on, 4 x 48 GB: auto
    # fitting finds no token budget or micro-batch for update_actor (not even one row fits a rank), so the
    # refusal is SP alone, without a micro-batch (auto picks it at that size); at that size auto fits.
    def stage(sp: int):
        cfg, spec, plan = validate(compose([
            *data_files, "algorithm.adv_estimator=grpo", "data.train_batch_size=16", "data.max_prompt_length=1024",
            "data.max_response_length=31744",
            f"{ARR}.model.path={QWEN7B}", f"{ARR}.model.use_remove_padding=true", "trainer.auto_micro_batch=true",
            f"{ARR}.model.enable_gradient_checkpointing=true", f"{ARR}.actor.ppo_mini_batch_size=16",
            f"{ARR}.rollout.n=16", f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.gpu_memory_utilization=0.5",
            "trainer.n_gpus=4", "trainer.gpu_memory_gb=48", "trainer.device=cuda", f"{SP}={sp}"]))
        return check_memory(cfg, spec, plan)

    with pytest.raises(ConfigError) as err:
        stage(1)
    assert str(err.value).endswith(
        f"a 32,768-token row does not fit at any micro-batch on one device; set {SP}=2 (Ulysses sequence "
        "parallelism: each row's tokens split over 2 ranks)"), err.value
    fitted = stage(2)  # auto's picks at SP 2 fit every phase
    assert "update_actor splits each row over 2 ranks" in fitted.table and "auto_micro_batch: " in fitted.table
