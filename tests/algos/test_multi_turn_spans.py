"""Tool-output spans in a multi-turn response (attention 1, loss 0) against the algorithms, numbers by hand.

The response below is one trajectory of a tool loop: two sampled tokens (the second the end-of-turn
token), two tool tokens, two sampled tokens; loss mask [1, 1, 0, 0, 1, 1].
"""

import pytest
import torch

from logicrl.algos import (
    RolloutCorrection,
    agg_loss,
    apply_correction,
    compute_advantage,
    compute_policy_loss,
    entropy_bonus,
    kl_penalty,
)

MASK = torch.tensor([[1, 1, 0, 0, 1, 1]], dtype=torch.bool)
TOOL = ~MASK[0]


def test_reinforce_plus_plus_returns_pass_over_the_tool_span_undiscounted():
    # Tool positions hold garbage rewards (9.0) that must count for nothing. G_5 = 1, G_4 = 0 + 0.5 * 1 = 0.5;
    # the span neither discounts nor resets (the fix verl made for multi-turn): G_1 = 0 + 0.5 * 0.5 = 0.25,
    # G_0 = 0.125; the span's own returns are 0.
    rewards = torch.tensor([[0.0, 0.0, 9.0, 9.0, 0.0, 1.0]], dtype=torch.float64)
    adv, returns = compute_advantage("reinforce_plus_plus", rewards, MASK, gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.125, 0.25, 0.0, 0.0, 0.5, 1.0]], dtype=torch.float64))
    # Whitened over the four valid returns: mean 0.46875, unbiased var = sum of squared deviations / 3.
    valid = torch.tensor([0.125, 0.25, 0.5, 1.0], dtype=torch.float64)
    mean = 0.46875
    var = float(((valid - mean) ** 2).sum()) / 3  # 0.1484375
    expected = [(g - mean) / (var + 1e-8) ** 0.5 for g in (0.125, 0.25)] + [0.0, 0.0] + \
               [(g - mean) / (var + 1e-8) ** 0.5 for g in (0.5, 1.0)]
    torch.testing.assert_close(adv, torch.tensor([expected], dtype=torch.float64))


def test_gae_passes_over_the_tool_span_by_hand():
    # gamma 0.5, lambda 1 (no whitening): over the valid tokens t = 0, 1, 4, 5 with V = 0.5, 0.25, 0.5, 0.5 and
    # rewards 0, 0, 0, 1; the span's values (7.0) are never read.
    # delta_5 = 1 - 0.5 = 0.5                      A_5 = 0.5
    # delta_4 = 0 + 0.5 * 0.5 - 0.5 = -0.25         A_4 = -0.25 + 0.5 * 0.5 = 0
    # delta_1 = 0 + 0.5 * 0.5 - 0.25 = 0            A_1 = 0 + 0.5 * 0 = 0
    # delta_0 = 0 + 0.5 * 0.25 - 0.5 = -0.375       A_0 = -0.375 + 0.5 * 0 = -0.375
    # returns = A + V: 0.125, 0.25, -, -, 0.5, 1.0
    rewards = torch.tensor([[0.0, 0.0, 9.0, 9.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.25, 7.0, 7.0, 0.5, 0.5]], dtype=torch.float64)
    adv, returns = compute_advantage("gae", rewards, MASK, values=values, gamma=0.5, lam=1.0,
                                     norm_adv_by_std_in_gae=False)
    torch.testing.assert_close(returns, torch.tensor([[0.125, 0.25, 0.0, 0.0, 0.5, 1.0]], dtype=torch.float64))
    raw = torch.tensor([-0.375, 0.0, 0.5], dtype=torch.float64)  # A_0, A_1 = A_4 = 0, A_5
    mean = float(raw[0] + raw[2]) / 4
    torch.testing.assert_close(adv, torch.tensor([[-0.375 - mean, -mean, 0, 0, -mean, 0.5 - mean]],
                                                 dtype=torch.float64))


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_group_estimators_score_the_sampled_tokens_only(estimator):
    # Two responses of one prompt; the tool span's garbage reward does not enter the sequence score.
    rewards = torch.tensor([[0.0, 0.0, 5.0, 5.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = MASK.expand(2, -1)
    adv, _ = compute_advantage(estimator, rewards, mask, index=torch.tensor([0, 0]))
    # grpo: scores 1, 0 -> +-1/sqrt(2) (unbiased std); rloo: 1 - 0 = 1 and -1.
    top = 2 ** -0.5 / (2 ** -0.5 + 1e-6) * 2 ** -0.5 if estimator == "grpo" else 1.0
    torch.testing.assert_close(adv[:, MASK[0]], torch.tensor([[top] * 4, [-top] * 4]), atol=1e-5, rtol=0)
    assert (adv[:, TOOL] == 0).all()


def _loss(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The actor's loss from logits [1, T, V]: PPO clip + entropy bonus + KL to a reference, token-mean,
    with rollout correction's weights and rejection (token level)."""
    log_probs = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)  # [1, T]
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)  # [1, T]
    old = log_probs.detach() + 0.05
    engine = torch.where(mask, old - 0.1, torch.zeros_like(old))  # the engine reports 0 on tool tokens
    corr = apply_correction(old, engine, mask, RolloutCorrection(rollout_is="token", rollout_is_threshold=2.0))
    advantages = torch.tensor([[0.5, 0.5, 3.0, 3.0, -1.0, -1.0]])
    pg = compute_policy_loss("vanilla", log_probs, old, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.2,
                             rollout_is_weights=corr.weights, keep=corr.keep)
    token_loss = pg.token_loss + entropy_bonus(entropy, mask, 0.01) + \
        0.1 * kl_penalty(log_probs, old - 0.2, mask, "low_var_kl")
    return agg_loss(token_loss, mask, "token-mean")


def test_perturbing_tool_token_logits_changes_neither_loss_nor_gradient():
    torch.manual_seed(0)
    vocab, tokens = 11, torch.tensor([[3, 2, 7, 8, 4, 2]])  # token 2: each assistant turn's end-of-turn
    logits = torch.randn(1, 6, vocab, requires_grad=True)
    loss = _loss(logits, tokens, MASK)
    (grad,) = torch.autograd.grad(loss, logits)
    perturbed = logits.detach().clone()
    perturbed[0, TOOL] += 100 * torch.randn(int(TOOL.sum()), vocab)
    perturbed.requires_grad_(True)
    loss2 = _loss(perturbed, tokens, MASK)
    (grad2,) = torch.autograd.grad(loss2, perturbed)
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(grad2, grad)
    assert (grad[0, TOOL] == 0).all()
    # Both end-of-turn tokens (columns 1 and 5) train: their logits get a gradient.
    assert grad[0, 1].abs().sum() > 0 and grad[0, 5].abs().sum() > 0


def test_the_token_mean_denominator_counts_sampled_tokens_only():
    token_loss = torch.tensor([[1.0, 2.0, 100.0, 100.0, 3.0, 4.0]])
    assert float(agg_loss(token_loss, MASK, "token-mean")) == pytest.approx(2.5)
