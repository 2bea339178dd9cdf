"""The eval group's checks and eval.checkpoints' resolution (config/eval_keys.py, config/evaluation.py):
refusals in-process, checkpoint kinds on hand-made directories."""

import json

import pytest

from logicrl.config.errors import ConfigError
from logicrl.config.evaluation import resolve
from logicrl.config.phases import ARR
from tests.conftest import ROLE_DATA, assert_refused, check_main, need_data

EVAL = ["+recipe=eval_math", "data.max_prompt_length=64", "data.max_response_length=8"]


@pytest.mark.parametrize(("overrides", "names"), [
    (["eval.n=2", "eval.k=[1,4]"], ("eval.k holds [4]", "outside 1..2", "eval.n")),
    (["eval.k=3"], ("eval.k=3", "list of integers")),
])
def test_ks_are_checked_against_n(overrides, names):
    need_data()
    assert_refused(check_main(*ROLE_DATA, *EVAL, *overrides), *names)


def test_checkpoints_need_val_only_and_exist(tmp_path):
    need_data()
    assert_refused(check_main(*ROLE_DATA, f"eval.checkpoints=[{tmp_path}]"), "eval.checkpoints", "+recipe=eval_math")
    assert_refused(check_main(*ROLE_DATA, *EVAL, f"eval.checkpoints=[{tmp_path / 'nope'}]"),
                   "eval.checkpoints[0]", "does not exist")


def test_an_evaluation_set_smaller_than_a_batch_plans_an_evaluation(tmp_path):
    need_data()
    data = tmp_path / "four.jsonl"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"p{i}"}], "data_source": "kk_role",
                                        "reward_model": {"ground_truth": {"name": "Zoey", "role": "knight"}}}) + "\n"
                            for i in range(4)))
    checked = check_main(f"data.val_files={data}", *EVAL, "data.train_batch_size=16", "eval.n=4", "eval.k=[1,4]",
                         "trainer.dry_run=true")
    assert checked.code == 0, checked.line
    assert "evaluate   4 prompts" in checked.out and "x n=4 responses" in checked.out
    assert "pass@k and maj@k for k in [1, 4]" in checked.out and "mini-batches" not in checked.out


def _hf(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def _step(root, n, complete=True):
    step = root / f"global_step_{n}"
    step.mkdir(parents=True)
    if complete:
        (step / "COMPLETE").write_text("")
    return step


def test_checkpoint_kinds(tmp_path):
    base = _hf(tmp_path / "base")
    assert resolve(base, "k").overrides == {f"{ARR}.model.path": str(base)}
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    target = resolve(adapter, "k")
    assert target.adapter == adapter and target.overrides == {f"{ARR}.model.path": str(base)}
    run = tmp_path / "run"
    _hf(_step(run, 2) / "huggingface")
    _step(run, 5, complete=False)  # a save cut short is passed over
    target = resolve(run, "k")
    assert target.label == "run/global_step_2"
    assert target.overrides == {f"{ARR}.model.path": str(run / "global_step_2" / "huggingface")}
    lora_run = tmp_path / "lora"
    export = _step(lora_run, 1) / "huggingface" / "lora_adapter"
    export.mkdir(parents=True)
    (export / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(base)}))
    assert resolve(lora_run / "global_step_1", "k").adapter == export
    sharded = tmp_path / "sharded"
    (_step(sharded, 3) / "shape.json").write_text(json.dumps(
        {"models": {f"{ARR}.model.path": {"path": str(base)}}, "lora": {f"{ARR}.model.lora_rank": 8}}))
    target = resolve(sharded, "k")
    assert target.init_from == sharded / "global_step_3"
    assert target.overrides == {f"{ARR}.model.path": str(base), f"{ARR}.model.lora_rank": 8}


def test_checkpoint_refusals(tmp_path):
    curriculum = tmp_path / "curr"
    _step(curriculum / "01_3ppl", 4)
    with pytest.raises(ConfigError, match=r"holds no complete global_step_N; its stages \['01_3ppl'\] do"):
        resolve(curriculum, "eval.checkpoints[0]")
    with pytest.raises(ConfigError, match="global_step_7 is incomplete"):
        resolve(_step(tmp_path / "r", 7, complete=False), "eval.checkpoints[0]")
    bare = _step(tmp_path / "bare", 1)
    with pytest.raises(ConfigError, match="no huggingface/ export and no shape.json"):
        resolve(bare, "eval.checkpoints[0]")
    adapter = tmp_path / "remote"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-0.5B"}))
    with pytest.raises(ConfigError, match="not a local directory"):
        resolve(adapter, "eval.checkpoints[0]")
