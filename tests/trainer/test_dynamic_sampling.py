"""Dynamic sampling's fill loop with a fake generator: rounds, kept and dropped groups, the limit."""

import pytest
import torch
from tensordict import TensorDict

from logicrl.trainer.dynamic_sampling import (
    FilterMetricError,
    Round,
    fill,
    merge_round_metrics,
    metric_values,
    trainable_prompts,
)

N = 2  # responses per prompt


def fake_rounds(accs_per_round: list[list[tuple[int, int]]]):
    """next_round for fill: round i's groups have the given (acc of response 0, acc of response 1)."""
    calls = []

    def next_round(i: int) -> Round:
        calls.append(i)
        groups = accs_per_round[i]
        first = sum(len(r) for r in accs_per_round[:i])
        uid = torch.arange(first, first + len(groups)).repeat_interleave(N)
        acc = torch.tensor([a for g in groups for a in g], dtype=torch.float64)
        batch = TensorDict({"uid": uid, "acc": acc}, batch_size=[len(uid)])
        return Round(batch, acc, {"critic/score/mean": float(acc.mean()), "critic/score/max": float(acc.max())})

    return next_round, calls


def test_one_round_fills_when_enough_groups_vary():
    # 4 groups, 2 with a spread; target 2: one round, 2 kept, 2 dropped.
    next_round, calls = fake_rounds([[(1, 1), (0, 1), (1, 0), (0, 0)]])
    filled = fill(next_round, target=2, n=N, max_rounds=3, max_empty=10)
    assert calls == [0] and not filled.short
    assert (filled.kept, filled.dropped, filled.prompts, filled.rounds) == (2, 2, 4, 1)
    assert filled.batch["uid"].tolist() == [1, 1, 2, 2]


def test_rounds_continue_until_full_and_extra_kept_groups_are_cut():
    # Round 0 keeps 1 of 3; round 1 keeps 2 of 3 -> 3 kept, target 2: the first two kept are trained.
    next_round, calls = fake_rounds([[(1, 1), (0, 1), (0, 0)], [(1, 0), (1, 1), (0, 1)]])
    filled = fill(next_round, target=2, n=N, max_rounds=None, max_empty=10)
    assert calls == [0, 1]
    assert (filled.kept, filled.dropped, filled.prompts, filled.rounds, filled.short) == (3, 3, 6, 2, False)
    assert filled.batch["uid"].tolist() == [1, 1, 3, 3]
    m = filled.step_metrics()
    assert (m["filter/groups_kept"], m["filter/groups_dropped"], m["filter/gen_rounds"],
            m["filter/prompts_consumed"], m["filter/kept_ratio"]) == (3, 3, 2, 6, 0.5)
    # Reward metrics over every generated response: round 0 has 3 right of 6, round 1 4 of 6; means
    # weighted by rows (6 and 6), the max the max.
    assert filled.reward_metrics["critic/score/mean"] == pytest.approx((3 / 6 + 4 / 6) / 2)
    assert filled.reward_metrics["critic/score/max"] == 1.0


def test_the_limit_stops_short_and_says_so():
    saturated = [[(1, 1), (1, 1)]] * 5
    next_round, calls = fake_rounds(saturated)
    filled = fill(next_round, target=2, n=N, max_rounds=3, max_empty=10)
    assert calls == [0, 1, 2] and filled.short and filled.batch is None
    assert (filled.kept, filled.dropped, filled.prompts) == (0, 6, 6)


def test_rounds_that_keep_nothing_end_the_step_even_without_a_round_limit():
    # A constant reward: no group ever varies. max_rounds=None (max_num_gen_batches=0) used to loop forever.
    next_round, calls = fake_rounds([[(1, 1), (0, 0)]] * 50)
    filled = fill(next_round, target=2, n=N, max_rounds=None, max_empty=4)
    assert calls == [0, 1, 2, 3] and filled.short and filled.batch is None
    assert (filled.empty, filled.rounds, filled.kept, filled.dropped) == (4, 4, 0, 8)


def test_a_round_that_keeps_a_group_restarts_the_empty_count():
    # empty, empty, one kept, empty, empty, empty: 3 in a row only from round 3 on -> stops after round 5.
    rounds = [[(1, 1)], [(0, 0)], [(0, 1)], [(1, 1)], [(1, 1)], [(1, 1)], [(0, 1)]]
    next_round, calls = fake_rounds(rounds)
    filled = fill(next_round, target=2, n=N, max_rounds=None, max_empty=3)
    assert calls == [0, 1, 2, 3, 4, 5] and filled.short
    assert (filled.kept, filled.empty) == (1, 3)
    assert filled.batch["uid"].tolist() == [2, 2]


def test_merge_round_metrics_weights_by_rows():
    merged = merge_round_metrics([(2, {"a/mean": 1.0, "a/min": 0.0}), (6, {"a/mean": 0.0, "a/min": -1.0, "b": 3.0})])
    assert merged == {"a/mean": 0.25, "a/min": -1.0, "b": 3.0}


def test_a_short_batch_trains_whole_mini_batches_of_every_role():
    assert trainable_prompts(7, [2]) == 6
    assert trainable_prompts(7, [2, 3]) == 6  # lcm 6
    assert trainable_prompts(5, [2, 3]) == 0
    assert trainable_prompts(8, [4]) == 8


def test_metric_values_by_name():
    scores = torch.tensor([[0., 1.], [0.5, -0.25]])  # token-level: the score on the last token
    results = [{"score": 1.0, "acc": 1.0, "format_ok": 1}, {"score": 0.25, "acc": 0.0, "format_ok": 0}]
    assert metric_values("seq_reward", scores, results).tolist() == [1.0, 0.25]
    assert metric_values("seq_final_reward", scores, results).tolist() == [1.0, 0.25]
    assert metric_values("acc", scores, results).tolist() == [1.0, 0.0]
    assert metric_values("score", scores, results).tolist() == [1.0, 0.25]
    assert metric_values("format_ok", scores, results).tolist() == [1.0, 0.0]
    with pytest.raises(FilterMetricError, match="metric=answer_ok: the reward gives no number of that name"):
        metric_values("answer_ok", scores, results)


def test_rounds_of_different_widths_join_with_prompts_left_and_responses_right_padded():
    from logicrl.trainer.batch import cat_rounds

    PAD = 9
    # Round a: prompt width 2, response width 1; round b: prompt width 1, response width 2.
    a = TensorDict({"input_ids": torch.tensor([[5, 6, 7]]), "attention_mask": torch.tensor([[1, 1, 1]]),
                    "position_ids": torch.tensor([[0, 1, 2]]), "responses": torch.tensor([[7]]),
                    "response_attention_mask": torch.tensor([[1]]), "response_mask": torch.tensor([[1]]),
                    "token_level_scores": torch.tensor([[1.0]]),
                    "uid": torch.tensor([0])}, batch_size=[1])
    b = TensorDict({"input_ids": torch.tensor([[4, 3, PAD]]), "attention_mask": torch.tensor([[1, 1, 0]]),
                    "position_ids": torch.tensor([[0, 1, 0]]), "responses": torch.tensor([[3, PAD]]),
                    "response_attention_mask": torch.tensor([[1, 0]]), "response_mask": torch.tensor([[1, 0]]),
                    "token_level_scores": torch.tensor([[0.5, 0.0]]),
                    "uid": torch.tensor([1])}, batch_size=[1])
    joined = cat_rounds([a, b], PAD)
    # Prompt width 2, response width 2: a gains a response pad on the right, b a prompt pad on the left.
    assert joined["input_ids"].tolist() == [[5, 6, 7, PAD], [PAD, 4, 3, PAD]]
    assert joined["attention_mask"].tolist() == [[1, 1, 1, 0], [0, 1, 1, 0]]
    assert joined["position_ids"].tolist() == [[0, 1, 2, 0], [0, 0, 1, 0]]
    assert joined["responses"].tolist() == [[7, PAD], [3, PAD]]
    assert joined["response_attention_mask"].tolist() == joined["response_mask"].tolist() == [[1, 0], [1, 0]]
    assert joined["token_level_scores"].tolist() == [[1.0, 0.0], [0.5, 0.0]]
    assert joined["uid"].tolist() == [0, 1]
