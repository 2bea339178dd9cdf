"""Policy losses, chosen by `actor_rollout_ref.actor.policy_loss.loss_mode` from POLICY_LOSSES.

A policy loss returns per-token losses, not a scalar: the caller adds the entropy bonus and the KL
loss term token by token and aggregates the sum once with `agg_loss` (aggregation.py). Aggregation
is linear, so that equals verl's aggregate-each-then-add, with one normaliser to carry across
micro-batches instead of three.

    out = compute_policy_loss("vanilla", log_probs, old_log_probs, advantages, mask, keep=keep, ...)
    token_loss = out.token_loss + entropy_bonus(entropy, mask, entropy_coeff) + kl_loss_coef * kl
    loss = agg_loss(token_loss, mask, loss_agg_mode, normalizer=..., max_response_length=...)

clip_ratio_low / clip_ratio_high are the resolved values: the caller substitutes clip_ratio for
either when the config leaves it null. Each loss also returns the metrics verl reports for it
(pg_clipfrac, pg_clipfrac_lower, ppo_kl), computed as verl computes them for that loss.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

import torch

from logicrl import algo_names
from logicrl.algos.masked import as_bool_mask, masked_count, masked_fill_zero, masked_mean, masked_sum
from logicrl.algos.metrics import policy_clip_metrics, ppo_kl
from logicrl.algos.registry import Registry

# No `inputs` list: a loss's own parameters come from its config keys (actor_rollout_ref.actor.policy_loss.*,
# a user's module may add keys), and config validation checks each key names a parameter of the loss.
POLICY_LOSSES = Registry("actor_rollout_ref.actor.policy_loss.loss_mode", names=algo_names.POLICY_LOSS_MODES)
register_policy_loss = POLICY_LOSSES.register

# exp() of a token's log-ratio is clamped to this range before use: a token whose probability collapsed
# between rollout and update would otherwise give an inf ratio, and inf * 0-advantage = nan. verl clamps
# the same way in vanilla, cispo and sapo; for clip_cov, kl_cov and geo_mean it has no clamp (there a
# log-ratio past 20 keeps its e^x loss and gradient, inf past 88 in float32) and logicrl keeps this one,
# so such a token gets no gradient, as in vanilla. gspo clamps its log ratio as verl does (GSPO_LOG_RATIO_MAX).
MAX_LOG_RATIO = 20.0


class PolicyLossOutput(NamedTuple):
    token_loss: torch.Tensor  # [B, T] loss per token, 0 at masked positions
    ratio: torch.Tensor  # [B, T] the importance ratio the loss used, 1 at masked positions
    # verl's actor/ metrics as verl computes them for this loss, detached 0-dim; a user's loss may report none
    metrics: Mapping[str, torch.Tensor] = MappingProxyType({})


def compute_policy_loss(
    loss_mode: str,
    log_probs: torch.Tensor,  # [B, T] current policy, with grad
    old_log_probs: torch.Tensor,  # [B, T] policy that sampled the batch
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,  # [B, T] rollout correction (algos/rollout_correction.py)
    keep: torch.Tensor | None = None,  # [B, T] response_mask less the tokens rollout correction rejected
    **params: float,  # loss parameters (tau_pos, clip_cov_ratio, ...): `call` passes each loss those it declares
) -> PolicyLossOutput:
    """Per-token policy loss by the loss named `loss_mode` (see POLICY_LOSSES).

    A rejected token (outside `keep`) is no part of the loss: the loss is computed over the kept tokens,
    so it has no gradient and its ratio enters no sequence ratio, mean or covariance. A loss that declares
    `keep` gets both masks and places its loss itself (geo_mean: a response keeps its weight).
    Rollout-correction IS weights multiply the per-token loss (verl multiplies pg_losses the same way in
    every loss), unless the loss declares `rollout_is_weights` and applies them itself (geo_mean: its
    loss is per sequence)."""
    impl = POLICY_LOSSES[loss_mode]
    declared = inspect.signature(impl).parameters
    mask = as_bool_mask(response_mask)
    keep = mask if keep is None else as_bool_mask(keep) & mask
    own_keep, own_weights = "keep" in declared, "rollout_is_weights" in declared
    loss_mask = mask if own_keep else keep
    out = POLICY_LOSSES.call(
        loss_mode, log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages,
        response_mask=loss_mask, keep=keep if own_keep else None, clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
        rollout_is_weights=rollout_is_weights if own_weights else None, **params,
    )
    if rollout_is_weights is not None and not own_weights:
        out = out._replace(token_loss=out.token_loss * masked_fill_zero(rollout_is_weights, loss_mask))
    return out


def clamped_log_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] log pi - log pi_old per token, 0 at padding, clamped to +-MAX_LOG_RATIO (no inf from a token
    the old policy all but ruled out)."""
    return masked_fill_zero(log_probs - old_log_probs, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def token_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] pi / pi_old per token, 1 at padding, from the clamped log-ratio."""
    return torch.exp(clamped_log_ratio(log_probs, old_log_probs, mask))


def _clipped_surrogate(ratio: torch.Tensor, advantages: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """max(-A r, -A clip(r, 1 - low, 1 + high)): PPO's pessimistic surrogate, as a loss."""
    if not (0 < low < 1 and high > 0):
        raise ValueError(f"clip ratios must satisfy 0 < clip_ratio_low < 1 and clip_ratio_high > 0; got {low}, {high}")
    return torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1 - low, 1 + high))


@register_policy_loss("vanilla")
def vanilla_policy_loss(
    log_probs: torch.Tensor,  # [B, T]
    old_log_probs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float = 3.0,
) -> PolicyLossOutput:
    """PPO's clipped objective (Schulman et al. 2017, arXiv:1707.06347) per token, with

    - asymmetric clipping, r clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]: DAPO's
      clip-higher (Yu et al. 2025, arXiv:2503.14476) raises the upper bound so low-probability
      tokens with positive advantage can still grow;
    - dual clip for A < 0 (Ye et al. 2020, arXiv:1912.09729): the loss is capped at
      clip_ratio_c * |A|, so a token whose ratio has run far above 1 with a negative advantage
      cannot dominate the batch. clip_ratio_c must exceed 1 (at <= 1 it would cap ordinary tokens).
    """
    if clip_ratio_c <= 1:
        raise ValueError(f"clip_ratio_c={clip_ratio_c} must be > 1 (the dual-clip bound on -A * ratio)")
    mask = as_bool_mask(response_mask)
    log_ratio = clamped_log_ratio(log_probs, old_log_probs, mask)
    ratio = torch.exp(log_ratio)
    advantages = masked_fill_zero(advantages, mask)
    loss = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    dual = torch.minimum(loss, -advantages * clip_ratio_c)
    loss = torch.where(advantages < 0, dual, loss)
    metrics = {**policy_clip_metrics(ratio, advantages, mask, clip_ratio_low, clip_ratio_high, clip_ratio_c),
               **ppo_kl(log_ratio, mask)}
    return PolicyLossOutput(masked_fill_zero(loss, mask), ratio, metrics)


# verl clamps GSPO's token log-ratio sg(log s_i) + log pi - sg(log pi) at 10, above only: past it the
# response's ratio is e^10 and its gradient 0 (with A > 0 the clip has long cut it; with A < 0 a runaway
# response stops pushing). No lower clamp is needed: exp of a very negative number is 0, not inf.
GSPO_LOG_RATIO_MAX = 10.0


@register_policy_loss("gspo")
def gspo_policy_loss(
    log_probs: torch.Tensor,  # [B, T]
    old_log_probs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> PolicyLossOutput:
    """Group Sequence Policy Optimisation (Zheng et al. 2025, arXiv:2507.18071), GSPO-token form.

    The ratio is the sequence's, s_i = exp(mean_t log(pi / pi_old)), length-normalised, and the
    clip applies to it, so a whole response is in or out. Each token carries
    s_i * pi(y_t) / sg[pi(y_t)]: the value is s_i and the gradient is s_i * grad log pi(y_t),
    which under loss_agg_mode=seq-mean-token-mean is exactly the paper's sequence-level gradient
    (verl forces that mode for gspo; here the config chooses, and the recipe should set it).
    GSPO's clip ranges are ~1e-4 wide (paper: 3e-4 / 4e-4), not PPO's 0.2. No dual clip: the
    paper has none.
    """
    mask = as_bool_mask(response_mask)
    log_probs = masked_fill_zero(log_probs, mask)
    log_ratio = masked_fill_zero(log_probs - old_log_probs, mask)
    seq_log_ratio = masked_sum(log_ratio, mask, dim=-1) / masked_count(mask, -1, log_ratio.dtype).clamp(min=1)  # [B]
    token_log_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach()[:, None]
    ratio = torch.exp(token_log_ratio.clamp(max=GSPO_LOG_RATIO_MAX))
    advantages = masked_fill_zero(advantages, mask)
    loss = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    ratio = torch.where(mask, ratio, torch.ones((), dtype=ratio.dtype, device=ratio.device))
    metrics = {**policy_clip_metrics(ratio.detach(), advantages, mask, clip_ratio_low, clip_ratio_high),
               **ppo_kl(log_ratio, mask)}
    return PolicyLossOutput(masked_fill_zero(loss, mask), ratio, metrics)


@register_policy_loss("cispo")
def cispo_policy_loss(
    log_probs: torch.Tensor,  # [B, T]
    old_log_probs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
) -> PolicyLossOutput:
    """CISPO (MiniMax-M1, arXiv:2506.13585): -sg(clip(r, 1 - low, 1 + high)) * A * log pi per token.

    The ratio is clipped and detached, then weights a REINFORCE term, so every token keeps a gradient
    (PPO's clip drops clipped tokens' gradients entirely); the paper clips only above: clip_ratio_low >= 1
    (verl's scripts set 10) puts the floor at or below 0, no lower clip. The loss value is not a surrogate's
    value (it carries log pi); only its gradient means anything, as in verl. pg_clipfrac counts every
    clipped weight whatever A's sign, as verl does."""
    mask = as_bool_mask(response_mask)
    log_ratio = clamped_log_ratio(log_probs, old_log_probs, mask)
    ratio = torch.exp(log_ratio)
    weight = ratio.detach().clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    loss = -weight * masked_fill_zero(advantages, mask) * masked_fill_zero(log_probs, mask)
    with torch.no_grad():
        metrics = {"actor/pg_clipfrac": masked_mean((weight != ratio).float(), mask),
                   "actor/pg_clipfrac_lower": torch.zeros((), device=ratio.device), **ppo_kl(log_ratio, mask)}
    return PolicyLossOutput(masked_fill_zero(loss, mask), ratio, metrics)


@register_policy_loss("geo_mean")
def gmpo_policy_loss(
    log_probs: torch.Tensor,  # [B, T]
    old_log_probs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
    rollout_is_weights: torch.Tensor | None = None,  # [B, T]
    keep: torch.Tensor | None = None,  # [B, T] bool, the tokens rollout correction kept (None: all)
) -> PolicyLossOutput:
    """GMPO, Geometric-Mean Policy Optimisation (Zhao et al. 2025, arXiv:2507.20673), verl's `geo_mean`.

    Each response's ratio is the geometric mean of its kept tokens' ratios, each clipped in log space to
    [-clip_ratio_low, clip_ratio_high] on the pessimistic side for the sign of A (the paper clips at
    (e^-0.4, e^0.4): set clip_ratio 0.4); the response's loss is -mean_t(A) * exp(mean_t clipped log r).
    It is spread over the response's kept tokens so that each row sums to |y_i| times it, as on every
    token without rejection: loss_agg_mode=seq-mean-token-mean gives verl's mean over responses exactly
    (verl ignores the mode; token-mean weights responses by length), and a rejected token leaves the ratio
    without changing the response's weight (a response with no kept token trains nothing). IS weights
    enter per response as their geometric mean, as in verl. Advantages are per sequence."""
    mask = as_bool_mask(response_mask)
    keep = mask if keep is None else as_bool_mask(keep) & mask
    kept = masked_count(keep, -1, log_probs.dtype)  # [B]
    log_ratio = masked_fill_zero(log_probs - old_log_probs, keep)
    sign = torch.sign(masked_fill_zero(advantages, keep))
    bounded = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    clipped = sign * torch.minimum(sign * log_ratio, sign * bounded)
    seq_ratio = torch.exp((masked_sum(clipped, keep, -1) / kept.clamp(min=1)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    seq_loss = -masked_sum(advantages, keep, -1) / kept.clamp(min=1) * seq_ratio  # [B]
    if rollout_is_weights is not None:
        log_w = masked_fill_zero(torch.log(rollout_is_weights.clamp(min=1e-10)), keep)
        seq_loss = seq_loss * torch.exp(masked_sum(log_w, keep, -1) / kept.clamp(min=1))
    spread = (seq_loss * masked_count(mask, -1, log_probs.dtype) / kept.clamp(min=1))[:, None]  # [B, 1]
    with torch.no_grad():  # verl's: log-space clip, its share by A's sign
        hit = log_ratio != bounded
        metrics = {"actor/pg_clipfrac": masked_mean((hit & (sign > 0)).float(), keep),
                   "actor/pg_clipfrac_lower": masked_mean((hit & (sign < 0)).float(), keep), **ppo_kl(log_ratio, keep)}
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    return PolicyLossOutput(masked_fill_zero(spread.expand_as(log_ratio), keep), ratio, metrics)


@register_policy_loss("sapo")
def sapo_policy_loss(
    log_probs: torch.Tensor,  # [B, T]
    old_log_probs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> PolicyLossOutput:
    """SAPO, Soft Adaptive Policy Optimisation (Gao et al. 2025, arXiv:2511.20347): -f(r) * A per token with
    the soft gate f(r) = sigmoid(tau * (r - 1)) * 4 / tau, tau = tau_pos where A > 0 else tau_neg.

    f(1) = 2 / tau and f'(r) = sigmoid'(tau (r - 1)) * 4, which is 1 at r = 1: on-policy the gradient is
    the plain policy gradient, and it fades smoothly as r leaves 1 instead of PPO's hard cut. No clip
    ratios, so pg_clipfrac is 0, as verl reports it. verl forces seq-mean-token-mean for sapo; here the
    config's mode applies (set that one)."""
    mask = as_bool_mask(response_mask)
    log_ratio = clamped_log_ratio(log_probs, old_log_probs, mask)
    ratio = torch.exp(log_ratio)
    advantages = masked_fill_zero(advantages, mask)
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    zero = torch.zeros((), device=ratio.device)
    metrics = {"actor/pg_clipfrac": zero, "actor/pg_clipfrac_lower": zero, **ppo_kl(log_ratio, mask)}
    return PolicyLossOutput(masked_fill_zero(-gate * advantages, mask), ratio, metrics)


@register_policy_loss("gpg")
def gpg_policy_loss(
    log_probs: torch.Tensor,  # [B, T]
    old_log_probs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
) -> PolicyLossOutput:
    """GPG, Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546): -log pi * A, plain REINFORCE with no
    ratio, no clip and no surrogate. As in verl, only the loss: the paper's own advantage and its
    valid-sample correction factor are not part of it (use the advantage estimators). The ratio returned
    is pi / pi_old; no clip metric (verl reports none), ppo_kl as for the other losses."""
    mask = as_bool_mask(response_mask)
    log_ratio = masked_fill_zero(log_probs - old_log_probs, mask)
    loss = -masked_fill_zero(log_probs, mask) * masked_fill_zero(advantages, mask)
    ratio = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)).detach()
    return PolicyLossOutput(masked_fill_zero(loss, mask), ratio, ppo_kl(log_ratio, mask))


def entropy_bonus(
    entropy: torch.Tensor,  # [B, T] per-token entropy of the current policy, with grad
    response_mask: torch.Tensor,  # [B, T]
    entropy_coeff: float,
) -> torch.Tensor:  # [B, T]
    """-entropy_coeff * H per token (entropy regularisation: Williams & Peng 1991; Mnih et al.
    2016, arXiv:1602.01783): minimising it raises entropy. Aggregated with the policy loss."""
    return masked_fill_zero(-entropy_coeff * entropy, response_mask)
