"""DAPO's group filter: groups whose metric does not vary are dropped."""

import torch

from logicrl.algos.group_filter import groups_with_spread


def test_uniform_groups_are_dropped_mixed_and_single_ones_kept():
    # uid 0: all right (1 1 1) -> dropped; uid 1: 0 1 0 -> kept; uid 2: all wrong -> dropped;
    # uid 3: one response -> kept (nothing to compare, as verl's `len == 1` rule).
    uid = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2, 3])
    acc = torch.tensor([1., 1., 1., 0., 1., 0., 0., 0., 0., 1.])
    keep = groups_with_spread(uid, acc)
    assert keep.tolist() == [False] * 3 + [True] * 3 + [False] * 3 + [True]


def test_interleaved_rows_and_equal_non_binary_scores():
    # Rows of a group need not be adjacent; -0.5 three times is no spread, 0.1 vs 0.1000001 is.
    uid = torch.tensor([7, 9, 7, 9, 7, 9])
    score = torch.tensor([-0.5, 0.1, -0.5, 0.1000001, -0.5, 0.1], dtype=torch.float64)
    assert groups_with_spread(uid, score).tolist() == [False, True, False, True, False, True]
