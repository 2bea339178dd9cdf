"""DAPO's group filter: which groups of a batch carry a learning signal."""

from __future__ import annotations

import torch


def groups_with_spread(
    uid: torch.Tensor,  # [B] int group id per response (a prompt's n responses share one)
    values: torch.Tensor,  # [B] float, the filter's metric per response (accuracy, sequence reward, ...)
) -> torch.Tensor:  # [B] bool, True on every row of a kept group
    """DAPO's dynamic-sampling filter (Yu et al. 2025, arXiv:2503.14476, eq. 11's constraint
    0 < |{correct}| < G): a group is kept when its values are not all equal.

    verl's recipe tests np.std(values) > 0; max > min is the same test without a rounding question
    (std of equal floats is exactly 0 either way). A group of one response is kept, as verl keeps it:
    it has no spread to test. Under grpo a dropped group's advantages are all 0 (every response
    equals the group mean), so dropping it changes no gradient, only which prompts fill the batch.
    """
    groups, index = torch.unique(uid, return_inverse=True)  # index [B] in [0, G)
    values = values.to(torch.float64)
    hi = torch.full((len(groups),), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, values, "amax")
    lo = torch.full((len(groups),), torch.inf, dtype=torch.float64).scatter_reduce(0, index, values, "amin")
    size = torch.bincount(index, minlength=len(groups))
    return ((hi > lo) | (size == 1))[index]
