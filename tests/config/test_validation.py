"""Each validation error: exit code 2, one line on stderr naming the key, no traceback.

The cases run main_ppo.py's checks in-process (`check_main`: the same override check, composition,
validation and preflight); two run the real entry point, since the exit code and the absence of
Hydra's multi-line report are part of the contract: an unknown key (refused before Hydra composes)
and a bad value (refused by validation inside the Hydra run).
"""

import json

import pytest

from logicrl.config.phases import ARR
from tests.conftest import assert_refused, check_main, run_main, write_jsonl


def assert_config_error(result, *needles):
    """A real launch's refusal: exit 2, one stderr line naming each of needles, no traceback."""
    assert result.returncode == 2, result.stdout + result.stderr
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in err, err


CASES = [
    # unknown keys, with the closest valid key suggested
    ([f"{ARR}.rollout.nn=3"], [f"`{ARR}.rollout.nn`", f"did you mean `{ARR}.rollout.n`"]),
    (["data.train_batch_sise=8"], ["did you mean `data.train_batch_size`"]),
    ([f"{ARR}.rollout.ppo_micro_batch_size_per_gpu=2"], [f"did you mean `{ARR}.actor.ppo_micro_batch_size_per_gpu`"]),
    # a key added with ++ reaches the schema merge, which must say the same
    ([f"++{ARR}.actor.clip_ratio_hi=0.3"], [f"`{ARR}.actor.clip_ratio_hi`", "did you mean"]),
    # types and impossible values
    (["data.train_batch_size=abc"], ["data.train_batch_size"]),
    ([f"{ARR}.rollout.n=0"], [f"{ARR}.rollout.n=0", ">= 1"]),
    ([f"{ARR}.rollout.temperature=0"], [f"{ARR}.rollout.temperature"]),
    ([f"{ARR}.rollout.top_p=1.5"], [f"{ARR}.rollout.top_p"]),
    (["algorithm.adv_estimator=ppo2"], ["algorithm.adv_estimator=ppo2", "grpo"]),
    ([f"{ARR}.actor.loss_agg_mode=mean"], [f"{ARR}.actor.loss_agg_mode"]),
    (["trainer.logger=[console,mlflow]"], ["trainer.logger", "mlflow"]),
    (["trainer.save_freq=0"], ["trainer.save_freq"]),
    ([f"{ARR}.actor.clip_ratio_low=1.2"], ["clip_ratio_low"]),
    # batch arithmetic
    (["data.train_batch_size=6", f"{ARR}.rollout.n=3", "trainer.n_gpus=4"],
     ["data.train_batch_size=6", "trainer.n_gpus=4"]),
    ([f"{ARR}.actor.ppo_mini_batch_size=3"], [f"{ARR}.actor.ppo_mini_batch_size=3", "data.train_batch_size=8"]),
    (["data.train_batch_size=8", f"{ARR}.rollout.n=2", f"{ARR}.actor.ppo_mini_batch_size=1", "trainer.n_gpus=4"],
     [f"{ARR}.actor.ppo_mini_batch_size=1", "trainer.n_gpus=4"]),
    ([f"{ARR}.actor.ppo_micro_batch_size_per_gpu=5"], [f"{ARR}.actor.ppo_micro_batch_size_per_gpu=5", "16"]),
    (["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=3"],
     ["critic.ppo_micro_batch_size_per_gpu=3"]),
    # deprecated global micro-batch that cannot split across ranks
    ([f"{ARR}.actor.ppo_micro_batch_size=6", "trainer.n_gpus=4"], [f"{ARR}.actor.ppo_micro_batch_size=6", "per rank"]),
    # group estimators need several responses per prompt
    (["algorithm.adv_estimator=grpo", f"{ARR}.rollout.n=1"], ["algorithm.adv_estimator=grpo", f"{ARR}.rollout.n"]),
    (["algorithm.adv_estimator=rloo", f"{ARR}.rollout.n=1"], ["algorithm.adv_estimator=rloo", f"{ARR}.rollout.n"]),
    # topology and engine
    (["trainer.n_gpus=4", "trainer.n_gpus_per_node=2"], ["trainer.n_gpus=4", "trainer.n_gpus_per_node=2"]),
    # a verl-only key that would change results (tensor_model_parallel_size: test_migration.py)
    ([f"{ARR}.rollout.mode=agent"], [f"{ARR}.rollout.mode=agent", "sync or async"]),
    # rollout correction: an option verl does not have (the other refusals:
    # tests/config/test_rollout_correction_config.py)
    (["algorithm.rollout_correction.rollout_rs=token_k9", "algorithm.rollout_correction.rollout_rs_threshold=2"],
     ["algorithm.rollout_correction.rollout_rs=token_k9", "token_k1"]),
    ([f"{ARR}.model.path=Qwen/Qwen2.5-7B-Instruct"], [f"{ARR}.model.path=Qwen/Qwen2.5-7B-Instruct", "local"]),
    (["trainer.resume_mode=/no/such/ckpt"], ["trainer.resume_mode"]),
    (["+recipe=stage9"], ["+recipe=stage9", "stage1"]),
    (["reward.custom.path=/no/such/reward.py"], ["reward.custom.path"]),
]


@pytest.mark.parametrize("overrides,needles", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_config_error(overrides, needles, data_files, tmp_path):
    assert_refused(check_main(*data_files, *overrides, "trainer.dry_run=true", cwd=tmp_path), *needles)


@pytest.mark.integration
@pytest.mark.parametrize("overrides,needles", [CASES[0], CASES[5]], ids=["unknown key", "bad value"])
def test_config_error_through_the_entry_point(overrides, needles, data_files, tmp_path):
    assert_config_error(run_main(*data_files, *overrides, "trainer.dry_run=true", cwd=tmp_path), *needles)


def test_missing_data_file_names_key_and_fix(tmp_path):
    result = check_main("data.train_files=nowhere/train.parquet", cwd=tmp_path)
    assert_refused(result, "data.train_files", "nowhere/train.parquet", "make data")


def test_data_file_with_wrong_format(data_files, tmp_path):
    csv = tmp_path / "train.csv"
    csv.write_text("prompt\nx\n")
    assert_refused(check_main(*data_files, f"data.val_files={csv}", cwd=tmp_path), "data.val_files", ".parquet")


def test_too_few_training_prompts(data_files, tmp_path):
    small = write_jsonl(tmp_path / "small.jsonl", 3)
    assert_refused(check_main(*data_files, f"data.train_files={small}", cwd=tmp_path),
                        "data.train_files", "data.train_batch_size=8")


def test_prompt_plus_response_beyond_model_positions(data_files, tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1,
        "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 1024}))
    result = check_main(*data_files, f"{ARR}.model.path={ckpt}", "data.max_prompt_length=400",
                        "data.max_response_length=1000", cwd=tmp_path)
    assert_refused(result, "data.max_response_length=1000", "1400", "max_position_embeddings=1024")


def test_model_dir_without_config_json(data_files, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_refused(check_main(*data_files, f"{ARR}.model.path={tmp_path / 'empty'}", cwd=tmp_path),
                   f"{ARR}.model.path", "config.json")


def test_knobs_that_only_split_work_are_clamped_not_errors(data_files, tmp_path):
    result = check_main(*data_files, f"{ARR}.actor.ppo_mini_batch_size=256",
                        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=64",
                        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=7", f"{ARR}.actor.ppo_epochs=2",
                        "trainer.dry_run=true", cwd=tmp_path)
    assert result.code == 0, result.line
    out = result.out
    assert f"{ARR}.actor.ppo_mini_batch_size=256 > data.train_batch_size=8: clamped to 8" in out
    clamped = "> the 32 responses of a per-rank mini-batch: clamped to 32"
    assert f"{ARR}.actor.ppo_micro_batch_size_per_gpu=64 {clamped}" in out
    # a forward-only micro-batch need not divide anything: 32 responses in forwards of <= 7 -> 5 forwards
    # (two epochs: the update is off-policy after the first, so the old-log-prob pass runs)
    assert "old log-prob 5 forwards of <= 7" in out


def test_summary_and_memory_table_agree_on_skipped_phases(data_files, tmp_path):
    # One epoch of one mini-batch: on-policy, so neither the summary nor the memory table plans the pass.
    result = check_main(*data_files, f"{ARR}.actor.ppo_mini_batch_size=8", "trainer.dry_run=true", cwd=tmp_path)
    assert result.code == 0, result.line
    assert "old log-prob skipped (on-policy" in result.out
    assert "old_log_prob     skipped: on-policy" in result.out


def test_custom_reward_without_the_named_function(data_files, tmp_path):
    fn = tmp_path / "my_reward.py"
    fn.write_text("def other(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    result = check_main(*data_files, f"reward.custom.path={fn}", "reward.custom.name=compute_score", cwd=tmp_path)
    assert_refused(result, "reward.custom.name", "compute_score")
