"""Loss aggregation: hand values per mode, and gradient accumulation == full-batch gradient."""

from __future__ import annotations

import pytest
import torch

from logicrl.algos import AGG_MODES, agg_loss, compute_policy_loss, entropy_bonus, kl_penalty, loss_normalizer

L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
M = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (1 + 2 + 4) / 3),
        ("seq-mean-token-sum", (3 + 4) / 2),
        ("seq-mean-token-mean", (1.5 + 4) / 2),
        ("seq-mean-token-sum-norm", (3 / 4 + 4 / 4) / 2),  # max_response_length = 4; verl's formula too
    ],
)
def test_each_mode_by_hand(mode, expected):
    assert agg_loss(L, M, mode, max_response_length=4).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", sorted(AGG_MODES))
def test_an_all_padding_row_changes_nothing(mode):
    padded_L = torch.cat([L, torch.full((1, 3), 99.0, dtype=torch.float64)])
    padded_M = torch.cat([M, torch.zeros(1, 3, dtype=torch.bool)])
    assert agg_loss(padded_L, padded_M, mode, max_response_length=4) == agg_loss(L, M, mode, max_response_length=4)


def test_sum_norm_requires_the_constant():
    with pytest.raises(ValueError, match="max_response_length=data.max_response_length"):
        agg_loss(L, M, "seq-mean-token-sum-norm")


@pytest.mark.parametrize("mode", sorted(AGG_MODES))
def test_nothing_valid_gives_zero_loss_and_zero_gradient(mode):
    token_loss = torch.ones(2, 3, requires_grad=True)
    loss = agg_loss(token_loss, torch.zeros(2, 3), mode, max_response_length=3)
    loss.backward()
    assert loss.item() == 0 and torch.equal(token_loss.grad, torch.zeros(2, 3))


# ---------------------------------------------------------------- gradient accumulation
B, T, V, D = 7, 6, 5, 3
LENGTHS = [6, 1, 3, 0, 5, 2, 4]  # one all-padding row: sequence counts must skip it
MICRO_SPLITS = [(0, 1), (1, 4), (4, 7)]  # 1, 3 and 3 rows of very different token counts


def make_batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    W0 = torch.randn(D, V, generator=g, dtype=torch.float64)
    feats = torch.randn(B, T, D, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (B, T), generator=g)
    mask = torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]
    with torch.no_grad():
        log_probs0 = torch.log_softmax(feats @ W0, -1).gather(-1, tokens[..., None]).squeeze(-1)
    batch = dict(
        feats=feats, tokens=tokens, mask=mask,
        # Old log-probs off by up to ~0.5 so that some tokens sit past each clip and some inside.
        old=log_probs0 + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64),
        ref=log_probs0 + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64),
        adv=torch.randn(B, T, generator=g, dtype=torch.float64),
    )
    return W0, batch


def micro(batch, start, stop):
    """Rows start:stop, with trailing padding trimmed to the micro-batch's own longest response,
    as dynamic batching / padding removal would hand them to the worker."""
    width = max(1, max(LENGTHS[start:stop]))
    return {k: v[start:stop, :width] for k, v in batch.items()}


def actor_token_loss(W, b, loss_mode):
    """The actor's full per-token loss: policy loss + entropy bonus + KL loss term."""
    log_all = torch.log_softmax(b["feats"] @ W, -1)
    log_probs = log_all.gather(-1, b["tokens"][..., None]).squeeze(-1)
    entropy = -(log_all.exp() * log_all).sum(-1)
    pg = compute_policy_loss(loss_mode, log_probs, b["old"], b["adv"], b["mask"],
                             clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    return pg.token_loss + entropy_bonus(entropy, b["mask"], 0.01) + 0.1 * kl_penalty(log_probs, b["ref"], b["mask"],
                                                                                      "low_var_kl")


def full_batch_grad(W0, batch, mode, loss_mode):
    W = W0.clone().requires_grad_()
    loss = agg_loss(actor_token_loss(W, batch, loss_mode), batch["mask"], mode, max_response_length=T)
    (grad,) = torch.autograd.grad(loss, W)
    return loss.detach(), grad


@pytest.mark.parametrize("loss_mode", ["vanilla", "gspo"])
@pytest.mark.parametrize("mode", sorted(AGG_MODES))
def test_accumulating_unequal_micro_batches_gives_the_full_batch_gradient(mode, loss_mode):
    W0, batch = make_batch()
    full_loss, full_grad = full_batch_grad(W0, batch, mode, loss_mode)

    W = W0.clone().requires_grad_()
    normalizer = loss_normalizer(batch["mask"], mode)  # once, from the whole mini-batch
    total = 0.0
    for start, stop in MICRO_SPLITS:
        b = micro(batch, start, stop)
        loss = agg_loss(actor_token_loss(W, b, loss_mode), b["mask"], mode, normalizer=normalizer,
                        max_response_length=T)
        loss.backward()  # accumulates into W.grad, no division by the number of micro-batches
        total += loss.detach()
    torch.testing.assert_close(total, full_loss)
    torch.testing.assert_close(W.grad, full_grad)
    assert full_grad.abs().sum() > 0  # the comparison is not between two zero gradients


@pytest.mark.parametrize("mode", sorted(AGG_MODES))
def test_data_parallel_ranks_with_the_global_normaliser_and_dp_scaling(mode):
    # Two ranks with unequal shares; DDP/FSDP average their gradients. With the all-reduced
    # normaliser and loss * dp_size, the average is the full-batch gradient.
    W0, batch = make_batch(seed=1)
    _, full_grad = full_batch_grad(W0, batch, mode, "vanilla")
    normalizer = loss_normalizer(batch["mask"], mode)  # = sum of the ranks' counts
    rank_grads = []
    for rank_micro_batches in ([(0, 1), (1, 2)], [(2, 5), (5, 7)]):
        W = W0.clone().requires_grad_()
        for start, stop in rank_micro_batches:
            b = micro(batch, start, stop)
            (agg_loss(actor_token_loss(W, b, "vanilla"), b["mask"], mode, normalizer=normalizer,
                      max_response_length=T) * 2).backward()
        rank_grads.append(W.grad)
    torch.testing.assert_close((rank_grads[0] + rank_grads[1]) / 2, full_grad)


def test_normalising_each_micro_batch_by_itself_would_not_match():
    # Guards the test above against being vacuous: verl's old per-micro-batch mean, averaged over
    # micro-batches, weights the tokens of the short micro-batch more.
    W0, batch = make_batch()
    _, full_grad = full_batch_grad(W0, batch, "token-mean", "vanilla")
    W = W0.clone().requires_grad_()
    for start, stop in MICRO_SPLITS:
        b = micro(batch, start, stop)
        (agg_loss(actor_token_loss(W, b, "vanilla"), b["mask"], "token-mean") / len(MICRO_SPLITS)).backward()
    assert not torch.allclose(W.grad, full_grad)


def test_loss_normalizer_counts():
    assert loss_normalizer(M, "token-mean").item() == 3
    for mode in ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert loss_normalizer(torch.cat([M, torch.zeros(1, 3, dtype=torch.bool)]), mode).item() == 2
