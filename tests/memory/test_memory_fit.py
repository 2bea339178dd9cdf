"""The plan's structure, the refusal (phase, need vs capacity, the knob at its computed value) and
auto_micro_batch, on the shape configs of logicrl/memory/shapes/ (no weights)."""

from dataclasses import replace

import pytest

from logicrl.config import ConfigError
from logicrl.config.phases import ARR
from logicrl.memory.fit import auto_micro_batch, check_fit
from logicrl.memory.phases import GB
from logicrl.memory.planner import format_table, plan_inputs
from logicrl.preflight.memory import check_memory
from tests.conftest import check_main, run_main
from tests.memory.conftest import GRPO_7B, inputs, step_plan

MICRO = f"{ARR}.actor.ppo_micro_batch_size_per_gpu"
def test_plan_has_every_phase_and_skips_what_does_not_run(data):
    _, _, x = inputs(data)
    plan = plan_inputs(x, 80 * GB)
    assert [p.name for p in plan.phases] == ["generate", "reward_model", "old_log_prob", "ref", "values",
                                             "update_critic", "update_actor", "update_weights"]
    assert "reward_model.enable=false" in plan.phase("reward_model").skipped
    assert plan.phase("values").skipped and plan.phase("update_critic").skipped  # grpo: no critic
    assert not plan.phase("ref").skipped and not plan.phase("old_log_prob").skipped  # KL loss; 2 mini-batches
    # Resident on every phase, over 4 ranks (bf16 compute): the actor's fp32 master shard (4 bytes per
    # parameter) and its fp32 AdamW states (8), and the reference's bf16 shard (2); no gathered root,
    # since the forward-only phases reshard (workers/fsdp.py reshard).
    n = 7_615_616_512
    assert plan.phase("update_weights").parts["optimizer"] == pytest.approx(8 * n / 4, rel=1e-3)
    assert plan.phase("generate").parts["params"] == pytest.approx(4 * n / 4 + 2 * n / 4, rel=1e-3)
    table = format_table(plan)
    assert "update_actor" in table and "capacity 80.0 GB" in table


def test_more_ranks_shard_the_training_state(data):
    _, _, x = inputs(data)
    two, four = plan_inputs(replace(x, world=2), 80 * GB), plan_inputs(x, 80 * GB)
    assert two.phase("update_weights").parts["optimizer"] == pytest.approx(
        2 * four.phase("update_weights").parts["optimizer"], rel=1e-3)


def test_refusal_names_the_phase_the_need_and_the_largest_micro_batch_that_fits(data):
    _, _, x = inputs(data)
    plan = plan_inputs(x, 80 * GB)
    actor = plan.phase("update_actor").total
    assert actor > plan.usable  # 16 responses of 2560 tokens per micro-batch: far over
    # The largest divisor of the per-rank mini-batch (16) that fits, computed by re-planning.
    fitting = [m for m in (1, 2, 4, 8, 16)
               if plan_inputs(x.with_micro({MICRO: m}), 80 * GB).phase("update_actor").total <= plan.usable]
    with pytest.raises(ConfigError) as err:
        check_fit(plan)
    message = str(err.value)
    assert message.startswith(f"update_actor needs {actor / GB:.1f} GB > 79.0 GB usable per device")
    assert f"{ARR}.actor.ppo_micro_batch_size_per_gpu={max(fitting)}" in message
    assert f"{ARR}.model.enable_gradient_checkpointing=true" in message


def test_auto_micro_batch_picks_the_largest_that_fits(data):
    _, _, x = inputs(data)
    # Pinned: under "auto" a micro-batch of 4 that does not fit unsharded fits sharded.
    x = x.with_model("actor", grad_accum="unsharded")
    totals = {m: plan_inputs(x.with_micro({MICRO: m}), 1000 * GB).phase("update_actor").total for m in (1, 2, 4)}
    assert totals[1] < totals[2] < totals[4]
    # A device between the micro-batch-2 and micro-batch-4 peaks: 2 is the answer, and it fits.
    capacity = (totals[2] + totals[4]) // 2 + GB  # + the 1 GB kept free on a GPU
    picked = auto_micro_batch(x, capacity)
    assert picked[MICRO] == 2
    fitted = plan_inputs(x.with_micro(picked), capacity)
    assert fitted.phase("update_actor").total <= fitted.usable


def test_preflight_applies_auto_micro_batch_and_refuses_what_cannot_fit(data):
    cfg, spec, plan = step_plan(data, "trainer.gpu_memory_gb=80", "trainer.auto_micro_batch=true")
    planned = check_memory(cfg, spec, plan)
    table, fitted = planned.table, planned.plan
    assert "auto_micro_batch:" in table
    # A new plan, the config untouched: the actor's micro-batch is the one auto_micro_batch picked.
    key = f"{ARR}.actor.ppo_micro_batch_size_per_gpu"
    assert fitted.micro("update_actor").value < plan.micro("update_actor").value
    assert f"{key}={fitted.micro('update_actor').value}" in table
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == plan.micro("update_actor").value
    cfg, spec, plan = step_plan(data, "trainer.gpu_memory_gb=12")  # the 7B's own weights do not fit
    with pytest.raises(ConfigError, match=r"needs .* GB > 11.0 GB usable per device"):
        check_memory(cfg, spec, plan)


@pytest.mark.integration
def test_entry_point_refuses_naming_the_knob_and_auto_micro_batch_fits(data, tmp_path):
    args = [*data, *GRPO_7B, "trainer.dry_run=true"]
    result = run_main(*args, "trainer.gpu_memory_gb=80", cwd=tmp_path)
    # main_ppo runs the preflight before anything loads: a refusal is one line and exit code 2.
    assert result.returncode == 2, result.stdout[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: update_actor needs") and " GB > 79.0 GB usable per device" in last, last
    assert f"{ARR}.actor.ppo_micro_batch_size_per_gpu=" in last
    # The same dry run with auto_micro_batch passes: main_ppo.py's checks in-process (a dry run's launch is
    # tests/config/test_dry_run.py's).
    fitted = check_main(*args, "trainer.gpu_memory_gb=80", "trainer.auto_micro_batch=true",
                        f"hydra.run.dir={tmp_path / 'fitted'}", cwd=tmp_path)
    assert fitted.code == 0, (fitted.line, fitted.err)
    assert "auto_micro_batch: " in fitted.out and "would refuse" not in fitted.out


def test_weight_sync_holds_one_bucket_plus_the_tensor_being_gathered(data):
    # Qwen2.5-7B in bf16 on 4 ranks: the largest tensor is the [152064, 3584] embedding (and the untied
    # lm_head), 152064 * 3584 * 2 = 1_089_994_752 bytes; the whole model is 2 * 7_615_616_512 bytes.
    largest, model = 152064 * 3584 * 2, 2 * 7_615_616_512
    _, _, x = inputs(data)

    def synced(bucket_mb: int, world: int = 4) -> int:
        return plan_inputs(replace(x, update_weights_bucket_mb=bucket_mb, world=world), 80 * GB).phase(
            "update_weights").parts["params"]

    assert x.update_weights_bucket_mb == 512  # conf's default, read from the config
    # 512 MiB is less than the embedding: the peak is the embedding gathered alone, two buffers of it.
    assert synced(1) == synced(512)
    # 4096 MiB: a full bucket plus the next tensor's second buffer, 4 GiB + 1.09 GB instead of 2 x 1.09 GB.
    assert synced(4096) - synced(512) == 4096 * 2**20 + largest - 2 * largest == 3_204_972_544
    # A bucket larger than the model holds the model at most.
    assert synced(10**6) - synced(512) == model + largest - 2 * largest
    # One rank: full_tensor() is the shard itself, but each fp32 master is cast to bf16 before it is
    # "gathered", so the bucket holds bf16 copies: the largest tensor alone, or a full 4 GiB bucket.
    assert synced(4096, world=1) - synced(1, world=1) == 4096 * 2**20 - largest
    # With fp32 compute nothing is cast, and the bucket holds references only.
    fp32 = replace(x, dtype_bytes=4, world=1)
    assert plan_inputs(replace(fp32, update_weights_bucket_mb=4096), 80 * GB).phase("update_weights").parts[
        "params"] == plan_inputs(replace(fp32, update_weights_bucket_mb=1), 80 * GB).phase("update_weights").parts[
        "params"]


def test_every_phase_with_a_micro_batch_key_has_its_size_chosen():
    """A phase added to config/phases.py with a micro-batch key is placed in fit.SIZED's order."""
    from logicrl.config.phases import STEP
    from logicrl.memory.fit import SIZED

    assert sorted(SIZED) == sorted(p.name for p in STEP if p.rows_key)
