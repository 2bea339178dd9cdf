"""The reward step with a learned score: reward.combine per data_source, the combined score on each
response's last real token, the rule not called for a source without one and, where its weight is 0,
scored for the report (accuracy) only. Numbers worked by hand."""

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from logicrl.models.loading import load_tokenizer
from logicrl.reward.combine import CombineRule
from logicrl.trainer.rewards import RewardManager, accuracy
from logicrl.trainer.validation import validation_metrics


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded:tiny", quiet=True)


def batch_of(tokenizer, answers, sources, rm_scores, width=6):
    ids = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]
    responses = torch.full((len(ids), width), tokenizer.pad_token_id)
    mask = torch.zeros_like(responses)
    for i, row in enumerate(ids):
        responses[i, :len(row)], mask[i, :len(row)] = torch.tensor(row), 1
    truth = {"name": "Zoey", "role": "knight"}
    return TensorDict({"responses": responses, "response_attention_mask": mask, "response_mask": mask.clone(),
                       "rm_scores": torch.tensor(rm_scores),
                       "data_source": NonTensorStack.from_list(sources),
                       "ground_truth": NonTensorStack.from_list([truth] * len(ids)),
                       "extra_info": NonTensorStack.from_list([{}] * len(ids))}, batch_size=[len(ids)])


def test_weighted_and_model_only_sources(tokenizer):
    # kk_role rows: 0.5 x learned + 2 x rule (rule: +1 right role, 0 the other, -1 no role).
    # "chat" rows: the learned score alone; the source has no rule reward, so calling it would raise.
    rule = CombineRule.from_config("weighted", {"model": 0.5, "rule": 2.0}, {"chat": "model"})
    rewards = RewardManager(tokenizer, combine=rule)
    batch = batch_of(tokenizer, [" knight", " knave", " hello there", " anything"],
                     ["kk_role", "kk_role", "kk_role", "chat"], [1.0, -2.0, 4.0, 3.0])
    token_scores, metrics, _, results = rewards(batch)
    expected = [0.5 * 1.0 + 2 * 1.0, 0.5 * -2.0 + 2 * 0.0, 0.5 * 4.0 + 2 * -1.0, 3.0]  # 2.5, -1, 0, 3
    assert [r["score"] for r in results] == expected
    assert [r.get("rule_score") for r in results] == [1.0, 0.0, -1.0, None]
    lengths = batch["response_attention_mask"].sum(-1)
    for i, score in enumerate(expected):  # on the last real token only
        row = torch.zeros(6)
        row[lengths[i] - 1] = score
        assert torch.equal(token_scores[i], row), i
    assert metrics["critic/score/mean"] == pytest.approx(sum(expected) / 4)
    assert metrics["reward_model/score/mean"] == pytest.approx((1 - 2 + 4 + 3) / 4)
    assert (metrics["reward_model/score/max"], metrics["reward_model/score/min"]) == (4.0, -2.0)
    assert metrics["reward/rule_score/mean"] == pytest.approx(0.0)  # over the three rows the rule scored


def test_without_a_learned_score_the_rule_alone_scores(tokenizer):
    # A batch without rm_scores (the reward-model phase did not run) is scored by the rule.
    rewards = RewardManager(tokenizer, combine=CombineRule.from_config("model", {}, None))
    batch = batch_of(tokenizer, [" knight", " knave"], ["kk_role"] * 2, [9.0, 9.0]).exclude("rm_scores")
    _, metrics, _, results = rewards(batch)
    assert [r["score"] for r in results] == [1.0, 0.0] and "reward_model/score/mean" not in metrics


def test_model_mode_still_reports_the_rules_accuracy_without_rewarding_it(tokenizer):
    # mode=model: each reward is the learned score alone, yet kk_role's rule still scores each response for the
    # report (train accuracy, val/acc). "chat" has no rule: the learned score alone, and no accuracy at all.
    rewards = RewardManager(tokenizer, combine=CombineRule.from_config("model", {}, None))
    batch = batch_of(tokenizer, [" knight", " knave", " hello there", " anything"],
                     ["kk_role", "kk_role", "kk_role", "chat"], [1.0, -2.0, 4.0, 3.0])
    token_scores, metrics, _, results = rewards(batch)
    assert [r["score"] for r in results] == [1.0, -2.0, 4.0, 3.0]  # the rule's +1 / 0 / -1 are not added
    assert token_scores.sum(-1).tolist() == [1.0, -2.0, 4.0, 3.0]
    assert [r.get("rule_score") for r in results] == [1.0, 0.0, -1.0, None]
    assert [accuracy(r) for r in results] == [1.0, 0.0, 0.0, None]
    assert metrics["reward/acc/mean"] == pytest.approx(1 / 3)  # over the three rows a rule scored
    assert metrics["reward/rule_score/mean"] == pytest.approx(0.0)
    assert metrics["critic/score/mean"] == pytest.approx((1 - 2 + 4 + 3) / 4)
    val = validation_metrics(batch, results)
    assert val == pytest.approx({"val/acc": 1 / 3, "val/kk_role/acc": 1 / 3, "val/score": 1.5})  # no val/chat/acc


def test_accuracy_is_the_rules_never_the_reward_models():
    assert accuracy({"score": 0.7, "acc": 0.0}) == 0.0  # the rule's own accuracy component
    assert accuracy({"score": 0.5}) == 1.0  # rules alone, no acc component: a positive rule score is right
    assert accuracy({"score": 3.0, "rule_score": -1.0}) == 0.0  # combined: the rule's score, not the learned one
    assert accuracy({"score": 3.0, "rule_score": None}) is None  # the reward model alone scored it
