"""A data_source with no rule reward (here "chat") is scored by the reward model alone where reward.combine
says so (mode=model, or by_data_source.chat=model); any other mode for it is refused by the data check, in
one line naming the file, the row, the key and the fix, before a model loads. Checkpoints here are
config.json only; the training run through the real entry point is tests/trainer/test_model_only_train.py."""

from __future__ import annotations

import pytest

from logicrl.config import compose, validate
from logicrl.config.rewards import reward_check
from logicrl.data.dataset import DatasetError
from logicrl.preflight.data import check_data
from tests.config.conftest import write_checkpoint
from tests.conftest import CHAT, KK_ROLE, write_rows


@pytest.fixture
def mixed(tmp_path):
    """Overrides for training and validation files of kk_role rows and, from row 2 on, chat rows."""
    train = write_rows(tmp_path / "train.jsonl", [KK_ROLE] * 2 + [CHAT] * 6)
    val = write_rows(tmp_path / "val.jsonl", [KK_ROLE, CHAT])
    rm = write_checkpoint(tmp_path / "rm")
    return [f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "reward_model.enable=true",
            f"reward_model.model.path={rm}"]


def checked(overrides):
    cfg, _, _ = validate(compose(overrides))
    check_data(cfg, None)  # the preflight's row check without a tokenizer (a dry run's)
    return cfg


@pytest.mark.parametrize("combine", [
    ["reward.combine.mode=model"],
    ["reward.combine.mode=weighted", "reward.combine.by_data_source={chat: model}"],
    ["reward.combine.mode=rule", "reward.combine.by_data_source={chat: model}"],
])
def test_a_model_only_source_loads(mixed, combine):
    cfg = checked([*mixed, *combine])
    check = reward_check(cfg)
    assert check("chat", "anything") is None
    # Its neighbours' ground truths are still read by their rule (the rule scores them, at least for the report).
    assert "does not fit the 'kk_role' reward" in check("kk_role", "knight")


@pytest.mark.parametrize("combine, key", [
    (["reward.combine.mode=weighted"], "but reward.combine.mode=weighted weighs one in (rule weight 1)"),
    (["reward.combine.mode=rule"], "but reward.combine.mode=rule weighs one in (rule weight 1)"),
    (["reward.combine.by_data_source={chat: rule}"], "but reward.combine.by_data_source.chat=rule weighs one in"),
    (["reward.combine.by_data_source={chat: {model: 1, rule: 0.5}}"],
     "but reward.combine.by_data_source.chat weighs one in (rule weight 0.5)"),
])
def test_any_other_mode_for_it_is_refused_naming_the_file_the_key_and_the_fix(mixed, tmp_path, combine, key):
    with pytest.raises(DatasetError) as err:
        checked([*mixed, *combine])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"data.train_files: {tmp_path / 'train.jsonl'} row 2: no rule reward for "
                              "data_source='chat' (known: ["), message
    assert key in message, message
    assert "set reward.combine.by_data_source.chat=model to score it by the reward model alone" in message


def test_without_a_reward_model_it_is_refused_with_the_way_to_add_one(mixed, tmp_path):
    rules_alone = [o for o in mixed if not o.startswith("reward_model.")]
    with pytest.raises(DatasetError) as err:
        checked(rules_alone)
    message = str(err.value)
    assert message.startswith(f"data.train_files: {tmp_path / 'train.jsonl'} row 2: no rule reward for "
                              "data_source='chat'"), message
    assert ("score it by a reward model alone (reward_model.enable=true, reward_model.model.path, "
            "reward.combine.by_data_source.chat=model)") in message
