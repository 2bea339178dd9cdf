"""A data_source with no rule reward trains through the real entry point, scored by the reward model alone
(reward.combine.by_data_source.chat=model), beside kk_role rows scored by 1 x learned + 1 x rule; and the same
data with the rule weighed in for chat is refused in one line before any model loads.

Rows alternate kk_role, chat and are not shuffled, so every step and the validation hold as many of each:
the step's mean score is then the learned mean plus half the rule's mean over the kk_role rows, and
accuracy (the rule's) covers the kk_role rows alone.
"""

import json

import pytest

from logicrl.config.phases import ARR
from tests.conftest import CHAT, KK_ROLE, TINY_RUN, assert_refused, check_main, read_metrics, run_main, tail, write_rows
from tests.workers.conftest import write_tiny_reward_model

RUN = [*TINY_RUN, "data.shuffle=false", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4", "trainer.test_freq=2",
       "reward_model.enable=true", "reward.combine.mode=weighted"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("model_only")
    train = write_rows(root / "train.jsonl", [KK_ROLE, CHAT] * 4)
    val = write_rows(root / "val.jsonl", [KK_ROLE, CHAT])
    rm = write_tiny_reward_model(root / "rm")
    return [f"data.train_files={train}", f"data.val_files={val}", f"reward_model.model.path={rm}"]




@pytest.mark.integration
def test_a_model_only_source_trains_scored_by_the_reward_model_alone(files, tmp_path):
    result = run_main(*RUN, *files, "reward.combine.by_data_source={chat: model}", ckpt=tmp_path / "ckpt",
                      run_dir=tmp_path / "run")
    assert result.returncode == 0, tail(result)
    run = tmp_path / "run"
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert "timing_s/update_actor" in row
        assert row["critic/score/mean"] == pytest.approx(
            row["reward_model/score/mean"] + 0.5 * row["reward/rule_score/mean"], abs=1e-5)
        assert 0 <= row["reward/acc/mean"] <= 1  # the kk_role rows' accuracy
    val = rows[-1]
    assert val["val/acc"] == val["val/kk_role/acc"] and "val/chat/acc" not in val
    samples = [json.loads(line) for line in (run / "val_generations/step_2.jsonl").read_text().splitlines()]
    chat = samples[1]["result"]
    assert samples[1]["ground_truth"] == "a kind reply"
    assert chat["rule_score"] is None and set(chat) == {"rule_score", "score"}  # the learned score alone
    assert {"acc", "rule_score", "score"} <= set(samples[0]["result"])


def test_the_rule_weighed_in_for_it_is_refused_before_anything_starts(files, tmp_path):
    # main_ppo.py's checks in-process (check_main): the preflight's refusal path launches in tests/bad_inputs.
    result = check_main(*RUN, *files, f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                        f"hydra.run.dir={tmp_path / 'run'}")
    line = assert_refused(result, "but reward.combine.mode=weighted weighs one in",
                          "set reward.combine.by_data_source.chat=model")
    assert line.startswith(f"error: data.train_files: {files[0].split('=', 1)[1]} row 1: no rule reward for "
                           "data_source='chat'"), line
    assert not (tmp_path / "ckpt").exists()
