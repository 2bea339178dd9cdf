"""Two FSDP2 ranks over gloo give the same update as one rank on the same batch.

Each rank holds half the responses (micro-batches of unequal valid tokens); with the
mini-batch normaliser summed over ranks and FSDP2's gradient averaging undone, the gradient
must equal the full batch's. One spawn of one rank and one of two serve every test (Scenario: each
update on its own model in the same process group).
"""

import pytest
import torch

from tests.helpers.actor_ranks import Scenario, run

pytestmark = pytest.mark.integration

MICRO_1 = {"ppo_micro_batch_size_per_gpu": 1}
PACKED = {"remove_padding": True, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 24}


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("actor_dp")
    [one] = run(1, tmp, Scenario())
    two, unsharded, sharded, packed = run(2, tmp, Scenario(), Scenario(MICRO_1), Scenario(MICRO_1, sharded_grads=True),
                                          Scenario(PACKED))
    return {"one": one, "two": two, "unsharded": unsharded, "sharded": sharded, "packed": packed}


def test_two_ranks_match_one_rank(updates):
    one, two = updates["one"], updates["two"]
    assert abs(one["grad_norm"] - two["grad_norm"]) < 1e-5 * max(1.0, one["grad_norm"])
    initial = dict(build_params())
    moved = 0
    for name, p1 in one["params"].items():
        torch.testing.assert_close(two["params"][name] - initial[name], p1 - initial[name], atol=1e-7, rtol=1e-4)
        moved += int(not torch.equal(p1, initial[name]))
    assert moved == len(initial)  # the step changed every parameter, on both sides alike


def test_sharded_accumulation_gives_the_same_update(updates):
    # 4 rows per rank in micro-batches of 1: four backwards accumulate. Unsharded syncs once at the
    # end; sharded reduce-scatters each and adds the shards. Sums in another order: fp32 rounding only.
    unsharded, sharded = updates["unsharded"], updates["sharded"]
    assert abs(sharded["grad_norm"] - unsharded["grad_norm"]) < 1e-6 * max(1.0, unsharded["grad_norm"])
    initial = dict(build_params())
    for name, p in unsharded["params"].items():
        assert not torch.equal(p, initial[name])  # SGD moved it: the comparison below is not vacuous
        torch.testing.assert_close(sharded["params"][name], p, atol=1e-6, rtol=0)


def test_packed_token_budget_update_matches_padded(updates):
    """use_remove_padding with a token budget: the same SGD step as padded fixed micro-batches, on 2 ranks."""
    padded, packed = updates["two"], updates["packed"]
    assert packed["metrics"]["perf/micro_size/update_actor"] == 24
    torch.testing.assert_close(packed["grad_norm"], padded["grad_norm"], atol=1e-5, rtol=1e-5)
    for name, p in padded["params"].items():
        torch.testing.assert_close(packed["params"][name], p, atol=1e-5, rtol=0, msg=name)


def build_params():
    from tests.workers.conftest import build_tiny_qwen2

    return [(n, p.detach()) for n, p in build_tiny_qwen2(seed=0).named_parameters()]
