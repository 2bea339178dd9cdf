"""Token-budget micro-batches and OOM retries give the same update as fixed micro-batches.

Two FSDP2 ranks over gloo, or one (test_actor_dp's harness); the parameters after one SGD step compare
the gradients, and `actor/loss` is the mini-batch's loss whatever the split. One spawn of two ranks and
one of one rank run every update here.
"""

import pytest
import torch
from tensordict import TensorDict

from logicrl.workers.actor import forward_logprobs
from logicrl.workers.micro import split_by_tokens
from logicrl.workers.oom import MicroSize, OutOfMemoryAtMinimum, retry_on_oom
from tests.helpers.actor_ranks import Scenario, make_batch, run


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    # 4 responses per rank of 6-11 tokens: a budget of 20 packs them into 2-3 micro-batches. The OOM hits
    # the last micro-batch, after the first one's gradient was accumulated.
    fixed, dynamic, retried = run(2, tmp_path_factory.mktemp("two"), Scenario(),
                                  Scenario(dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20)),
                                  Scenario(fault="oom@update_actor:1"))
    return {"fixed": fixed, "dynamic": dynamic, "retried": retried}


@pytest.fixture(scope="module")
def fixed(two_ranks):
    return two_ranks["fixed"]


def assert_same_update(a: dict, b: dict):
    assert a["metrics"]["actor/loss"] == pytest.approx(b["metrics"]["actor/loss"], rel=1e-5)
    for name, p in a["params"].items():
        torch.testing.assert_close(b["params"][name], p, atol=1e-7, rtol=1e-5)


@pytest.mark.integration
def test_token_budget_micro_batches_match_fixed_ones(fixed, two_ranks):
    assert_same_update(fixed, two_ranks["dynamic"])


@pytest.mark.integration
def test_injected_oom_in_update_halves_the_micro_batch_and_gives_the_same_update(fixed, two_ranks):
    # The first micro-batch's accumulated gradient must be dropped with the failed attempt, not counted twice.
    retried = two_ranks["retried"]
    assert retried["metrics"]["perf/oom_retries/update_actor"] == 1
    assert retried["metrics"]["perf/micro_size/update_actor"] == 1  # 2 -> 1, kept for later steps
    assert fixed["metrics"]["perf/oom_retries/update_actor"] == 0
    assert_same_update(fixed, retried)


def test_forward_with_a_token_budget_returns_rows_in_order():
    from tests.workers.conftest import build_tiny_qwen2

    model, batch = build_tiny_qwen2(seed=0), make_batch(n=8)
    parts = split_by_tokens(batch, 24, torch.device("cpu"))
    assert 2 <= len(parts) < 8 and sorted(len(p) for p in parts) != [1] * len(parts)
    fixed = forward_logprobs(model, batch, MicroSize("old_log_prob", "micro", 3), 1.0)
    packed = forward_logprobs(model, batch, MicroSize("old_log_prob", "budget", 24, by_tokens=True), 1.0)
    torch.testing.assert_close(packed, fixed, atol=1e-6, rtol=0)


def test_oom_at_a_micro_batch_of_one_is_a_clear_error():
    size = MicroSize("update_actor", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 2)
    calls = []

    def always_oom(given):
        calls.append(given.value)
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(OutOfMemoryAtMinimum, match=r"ppo_micro_batch_size_per_gpu=1, the smallest split"):
        retry_on_oom(size, always_oom, torch.device("cpu"))
    assert calls == [2, 1]


def test_a_token_budget_under_sequence_parallelism_stays_per_rank():
    # Ulysses SP 2 (MicroSize.group): each rank computes half of every packed row, so a group's micro-batch
    # packs 2 x 12 tokens. Rows of 10, 9, 7 and 6 real tokens (32): two micro-batches of 16 (10+6, 9+7),
    # where one rank alone (group 1) takes ceil(32 / 12) = 3. The value reported (perf/micro_size), halved
    # and saved stays the per-rank budget of 12; halving stops at the longest row's share, ceil(10 / 2) = 5.
    lengths = torch.tensor([10, 9, 7, 6])
    batch = TensorDict({"attention_mask": (torch.arange(12)[None] < lengths[:, None]).long()}, batch_size=[4])
    size = MicroSize("old_log_prob", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", 12,
                     by_tokens=True, group=2)
    parts = size.split(batch, torch.device("cpu"))
    assert sorted(p["attention_mask"].sum().item() for p in parts) == [16, 16]
    assert len(MicroSize("old_log_prob", "k", 12, by_tokens=True).split(batch, torch.device("cpu"))) == 3
    calls = []

    def always_oom(given):
        calls.append(given.value)
        given.split(batch, torch.device("cpu"))
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(OutOfMemoryAtMinimum, match=r"log_prob_max_token_len_per_gpu=5, the smallest split"):
        retry_on_oom(size, always_oom, torch.device("cpu"))
    assert calls == [12, 6, 5]


@pytest.mark.integration
def test_an_oom_inside_the_forward_of_a_single_rank_is_retried_to_the_same_update(tmp_path):
    # One GPU: nothing to agree with, so the retry goes on in place, though the OOM left FSDP2 in the
    # middle of a forward (raised after the first decoder layer's; logicrl/faults.py `@rank0`).
    clean, hit = run(1, tmp_path, Scenario(), Scenario(fault="oom@update_actor:1@rank0"))
    assert (hit["metrics"]["perf/oom_retries/update_actor"], hit["metrics"]["perf/micro_size/update_actor"]) == (1, 1)
    assert_same_update(clean, hit)
