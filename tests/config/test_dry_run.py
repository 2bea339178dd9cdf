"""The dry-run summary's numbers, checked against hand-computed values.

The summaries come from main_ppo.py's dry run in-process (`check_main`); the multirun case at the end
runs the real entry point, which prints them the same way.
"""

import pytest

from logicrl.config.phases import ARR
from tests.conftest import BASE_BATCH, check_main, run_main, write_jsonl


@pytest.fixture
def dry_run(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", 20)
    val = write_jsonl(tmp_path / "val.jsonl", 4)

    def run(*overrides):
        result = check_main(f"data.train_files={train}", f"data.val_files={val}", *BASE_BATCH, "trainer.dry_run=true",
                            *overrides, cwd=tmp_path)
        assert result.code == 0 and not result.err, (result.line, result.err)
        return result.out

    return run


def test_summary_numbers(dry_run):
    # 8 prompts x n=4 = 32 responses over 2 ranks -> 16 each. Mini-batch 4 prompts -> 2 per step, x 2 epochs
    # = 4 optimizer steps; 4 x 4 / 2 = 8 responses per rank per mini-batch; micro 2 -> 4 accumulation steps.
    # Log-prob micro 3: ceil(16 / 3) = 6 forwards. 20 rows // 8 = 2 steps per epoch, x 3 epochs = 6 steps.
    out = dry_run("data.train_batch_size=8", f"{ARR}.rollout.n=4", "trainer.n_gpus=2",
                  f"{ARR}.actor.ppo_mini_batch_size=4", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
                  f"{ARR}.actor.ppo_epochs=2", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=3",
                  "trainer.total_epochs=3")
    assert "train 20 prompts" in out and "val 4 prompts" in out
    assert "2 steps per epoch, 6 steps in all" in out
    assert "8 prompts x n=4 = 32 responses; 16 responses per rank" in out
    assert "2 mini-batches of 4 prompts (16 responses) x 2 epochs = 4 optimizer steps per step" in out
    assert "a mini-batch is 8 responses = 4 micro-batches of 2 (gradient accumulation 4)" in out
    assert "old log-prob 6 forwards of <= 3; no reference (no KL term)" in out
    assert "ranks      2 (1 node(s) x 2)" in out
    assert "sized for a real model" not in out  # the embedded default is sized for its stand-in


def test_summary_with_reference_and_critic(dry_run):
    # gae brings the critic; the KL loss brings the reference. 8 x 2 = 16 responses on 1 rank;
    # critic mini 2 prompts -> 4 mini-batches of 4 responses, micro 2 -> accumulation 2; ref micro 5 -> 4 forwards.
    out = dry_run("algorithm.adv_estimator=gae", "data.train_batch_size=8", f"{ARR}.rollout.n=2",
                  f"{ARR}.actor.use_kl_loss=true",
                  "critic.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=2",
                  f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=5", "trainer.total_training_steps=7")
    assert "critic yes, reference yes" in out
    assert "critic     4 mini-batches of 2 prompts (4 responses) x 1 epochs = 4 optimizer steps per step" in out
    assert "a mini-batch is 4 responses = 2 micro-batches of 2 (gradient accumulation 2)" in out
    assert "ref log-prob: 4 forwards of <= 5" in out
    # 20 rows // 8 = 2 steps per epoch: total_training_steps=7 caps the run, it adds no epochs.
    assert "2 steps per epoch, 2 steps in all (trainer.total_training_steps=7 is more than 1 epoch(s) hold)" in out


def test_dry_run_prints_resolved_config_and_model_and_describes_dynamic_batching(dry_run):
    out = dry_run(f"{ARR}.actor.use_dynamic_bsz=true")
    assert "actor_rollout_ref:" in out and "n_gpus: 1" in out
    assert "embedded:tiny (qwen2: 2 layers" in out
    assert "no model was loaded" in out
    assert "packed into micro-batches by token budget" in out


def test_a_real_model_recipe_on_the_stand_in_says_so_in_one_line_and_goes_on(dry_run):
    # The design card's command with no model path: the note is one line, after the plan, and
    # the run goes on (exit 0 here; a real launch trains on as asked: the note stops nothing).
    out = dry_run("+recipe=stage1", "trainer.n_gpus=4")
    lines = [line for line in out.splitlines() if "sized for a real model" in line]
    assert len(lines) == 1 and lines[0].startswith("note: ")
    assert "actor_rollout_ref.model.path" in lines[0] and "+recipe=tiny_curriculum" in lines[0]
    assert out.index("update_actor") < out.index(lines[0])  # after the memory plan, before training


@pytest.mark.integration
def test_multirun_dry_run_runs_each_combination(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", 20)
    result = run_main("-m", f"data.train_files={train}", f"data.val_files={train}", *BASE_BATCH, "trainer.dry_run=true",
                      f"{ARR}.rollout.n=2,4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "8 prompts x n=2 = 16 responses" in result.stdout
    assert "8 prompts x n=4 = 32 responses" in result.stdout
