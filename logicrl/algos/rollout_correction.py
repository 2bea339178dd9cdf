"""Rollout correction: the engine sampled with pi_rollout, the trainer trains pi_theta (verl's
`algorithm.rollout_correction`; Liu, Li et al. 2025, "When Speed Kills Stability", richardli.xyz/rl-collapse).

    corr = RolloutCorrection.from_config(cfg.algorithm.rollout_correction)
    out = apply_correction(trainer_log_probs, rollout_log_probs, response_mask, corr)   # [B, T] each
    pg_token_loss * out.weights;  token_loss * out.keep

Two independent parts, both functions of the log-ratio log(pi_trainer / pi_rollout) per token:
  IS weights (rollout_is: token | sequence): w = exp(log-ratio) per token, or exp(sum) per sequence,
    truncated above at rollout_is_threshold (TIS), detached: they change the measure, not the objective.
  rejection (rollout_rs): a keep mask from divergence statistics against bounds, verl's canonical
    options `{token,seq_sum,seq_mean,seq_max}_k{1,2,3}`; verl's older level names are accepted:
    token -> token_k1, sequence -> seq_sum_k1, geometric -> seq_mean_k1 (the geometric mean ratio).
A rejected token is no part of the policy loss (compute_policy_loss's `keep`: no gradient, in no sequence
ratio). Departures from verl: `rollout_is_batch_normalize` normalises over the micro-batch the loss sees
(verl: the whole batch across ranks; the same with one micro-batch per mini-batch on one rank). Rejected
tokens keep their place in the loss normaliser (verl drops them in decoupled mode): a rejection removes a
token's gradient, it does not reweight the kept ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from logicrl.algos.masked import as_bool_mask, masked_mean, masked_sum

# exp() of a log-ratio is clamped to exp(+-20) (verl's SAFETY_BOUND): a sequence's summed log-ratio
# easily passes 88, where float32's exp overflows to inf and inf * 0 = nan.
SAFETY_BOUND = 20.0
IS_LEVELS = ("token", "sequence")
LOSS_TYPES = ("ppo_clip", "reinforce")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
RS_ALIASES = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}


class RejectRule(NamedTuple):
    option: str  # one of RS_OPTIONS
    lower: float | None  # k1 only: a ratio bound, compared in log space
    upper: float


def parse_rejection(rollout_rs: str | None, threshold: Any) -> tuple[RejectRule, ...]:
    """verl's `rollout_rs` (comma-separated options) and `rollout_rs_threshold` (one spec, or one per option)
    as rules; raises ValueError naming the bad part. k1 options take `lower_upper` ratio bounds (a single
    number u means 1/u_u); k2/k3 options take one positive upper bound."""
    if rollout_rs is None:
        return ()
    options = list(dict.fromkeys(RS_ALIASES.get(o.strip(), o.strip()) for o in str(rollout_rs).split(",") if o.strip()))
    unknown = [o for o in options if o not in RS_OPTIONS]
    if unknown or not options:
        raise ValueError(f"rollout_rs={rollout_rs}: {', '.join(unknown) or 'no option'} is not one of "
                         f"{', '.join(RS_OPTIONS + tuple(RS_ALIASES))}")
    if threshold is None:
        raise ValueError(f"rollout_rs={rollout_rs} needs rollout_rs_threshold (e.g. 0.5_2.0 for k1, 0.01 for k2/k3)")
    specs = [s.strip() for s in str(threshold).split(",") if s.strip()]
    if len(specs) == 1:
        specs *= len(options)
    if len(specs) != len(options):
        raise ValueError(f"rollout_rs_threshold={threshold} gives {len(specs)} bounds for {len(options)} options: "
                         "give one, or one per option")
    rules = []
    for option, spec in zip(options, specs):
        try:
            if option.endswith("k1"):
                low, _, up = spec.partition("_") if "_" in spec else (None, "", spec)
                upper = float(up)
                lower = 1.0 / upper if low is None else float(low)
            elif "_" in spec:
                raise ValueError
            else:
                lower, upper = None, float(spec)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"rollout_rs_threshold={threshold}: {spec} is not a bound for {option} "
                             "(k1: lower_upper ratios such as 0.5_2.0; k2/k3: one positive number)") from None
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"rollout_rs_threshold={threshold}: bounds for {option} must be positive")
        # A k1 band must hold ratio 1 (a token the engine and the trainer agree on): one that does not rejects
        # every token and the run trains on nothing, its gradient 0 every step.
        if lower is not None and not lower <= 1.0 <= upper:
            read = f"{lower:g}_{upper:g}" if low is None else spec
            trap = (f" (a bare {spec} means 1/{spec}_{spec}; YAML reads 0.5_2 unquoted as the number 0.52: quote it, "
                    "rollout_rs_threshold='\"0.5_2\"')" if low is None else "")
            raise ValueError(f"rollout_rs_threshold={threshold}: the {option} band {read} does not hold ratio 1, so it "
                             f"rejects every token{trap}; give lower_upper with lower <= 1 <= upper, e.g. 0.5_2.0")
        rules.append(RejectRule(option, lower, upper))
    return tuple(rules)


@dataclass(frozen=True)
class RolloutCorrection:
    """`algorithm.rollout_correction` resolved: what the actor's loss applies."""

    rollout_is: str | None = None  # None, token or sequence
    rollout_is_threshold: float = 2.0
    rollout_is_batch_normalize: bool = False
    rejection: tuple[RejectRule, ...] = ()
    bypass_mode: bool = False  # old log-probs := the engine's; no old-log-prob pass
    loss_type: str = "ppo_clip"  # bypass only: reinforce replaces the loss by IS-weighted REINFORCE

    @classmethod
    def from_config(cls, c) -> RolloutCorrection:
        """From the config node (validated: config/validate.py refuses what this would raise on)."""
        return cls(c.rollout_is, float(c.rollout_is_threshold), bool(c.rollout_is_batch_normalize),
                   parse_rejection(c.rollout_rs, c.rollout_rs_threshold), bool(c.bypass_mode), c.loss_type)

    @property
    def reweights(self) -> bool:
        """Whether IS weights multiply the policy loss. Bypass with ppo_clip: no, the PPO ratio already is
        pi_theta / pi_rollout (verl's rule: weighting it again would count the correction twice)."""
        return self.rollout_is is not None and not (self.bypass_mode and self.loss_type == "ppo_clip")


class Correction(NamedTuple):
    weights: torch.Tensor | None  # [B, T] detached IS weights, 0 at masked positions; None: no reweighting
    keep: torch.Tensor  # [B, T] bool: response_mask with the rejected tokens removed
    metrics: dict[str, torch.Tensor]  # rollout_corr/..., 0-dim tensors (no host sync here)


def _clamped_exp(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))


def is_weights(
    log_ratio: torch.Tensor,  # [B, T] log pi_trainer - log pi_rollout
    response_mask: torch.Tensor,  # [B, T]
    level: str,
    threshold: float,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Truncated IS weights [B, T] (min(w, threshold), 0 at masked positions) and verl's rollout_is_* metrics:

    rollout_is_mean   the truncated weights' mean over valid tokens (a response's weight counts once per token);
    rollout_is_max    token level: the largest truncated weight; sequence level: the largest untruncated one;
    rollout_is_ratio_fraction_high / _low   the share of tokens (responses) beyond threshold (1 / threshold);
    rollout_is_batch_norm_factor            with batch_normalize: the mean divided out (tokens, or responses).
    A sequence weight is the product of the ratios of the response's valid tokens wherever they sit."""
    mask = as_bool_mask(response_mask)
    rows = mask.any(-1)  # [B]
    log_ratio = log_ratio.detach().masked_fill(~mask, 0.0)
    if level == "token":
        log_w = log_ratio
    elif level == "sequence":
        seq_log = masked_sum(log_ratio, mask, dim=-1)  # [B]: log of the product of ratios
        log_w = seq_log[:, None].expand_as(log_ratio)
    else:
        raise ValueError(f"rollout_is={level!r} is not one of {IS_LEVELS}")
    weights = (_clamped_exp(log_w) * mask).clamp(max=threshold)
    if level == "token":
        unit_log, unit_mask = log_ratio, mask
        top = weights.masked_fill(~mask, 0.0).max()
    else:  # one weight per response, as verl's sequence metrics
        unit_log, unit_mask = seq_log, rows
        top = torch.where(rows.any(), _clamped_exp(seq_log.masked_fill(~rows, -torch.inf).max()), 0.0)
    metrics = {
        "rollout_corr/rollout_is_mean": masked_mean(weights, mask),
        "rollout_corr/rollout_is_max": top,
        "rollout_corr/rollout_is_ratio_fraction_high": masked_mean((unit_log > math.log(threshold)).to(weights.dtype),
                                                                   unit_mask),
        "rollout_corr/rollout_is_ratio_fraction_low": masked_mean((unit_log < -math.log(threshold)).to(weights.dtype),
                                                                  unit_mask),
    }
    if batch_normalize:
        unit = weights if level == "token" else _clamped_exp(seq_log).clamp(max=threshold)
        norm = masked_mean(unit, unit_mask)
        weights = weights / norm.clamp(min=1e-8)
        metrics["rollout_corr/rollout_is_batch_norm_factor"] = norm
    return weights, metrics


def _divergence(log_ratio: torch.Tensor, k: str) -> torch.Tensor:
    """Per-token statistic of verl's k-estimators of KL(rollout || trainer): k1 = -log r (compared with log
    bounds), k2 = (log r)^2 / 2, k3 = r - 1 - log r."""
    if k == "k1":
        return -log_ratio
    if k == "k2":
        return 0.5 * log_ratio.square()
    return _clamped_exp(log_ratio) - 1.0 - log_ratio


def rejection_mask(
    log_ratio: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    rules: tuple[RejectRule, ...],
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The tokens every rule keeps ([B, T] bool, within response_mask), and the fraction rejected:
    rollout_rs_masked_fraction (tokens) and rollout_rs_seq_masked_fraction (responses with any rejected).

    A k1 rule keeps lower <= r <= upper in verl's form, log(lower) <= -log r <= log(upper) (so a pair like
    0.5_2.0, symmetric in log space, means what it says either way); a sequence rule reduces the token
    statistic over the response (sum, mean = the geometric-mean ratio for k1, max) and keeps or drops the
    whole response."""
    mask = as_bool_mask(response_mask)
    log_ratio = log_ratio.detach().clamp(-SAFETY_BOUND, SAFETY_BOUND).masked_fill(~mask, 0.0)
    keep = mask.clone()
    for rule in rules:
        level, _, k = rule.option.rpartition("_")
        stat = _divergence(log_ratio, k)
        if level == "seq_sum":
            stat = masked_sum(stat, mask, dim=-1)[:, None]
        elif level == "seq_mean":
            stat = (masked_sum(stat, mask, dim=-1) / mask.sum(-1).clamp(min=1))[:, None]
        elif level == "seq_max":
            stat = stat.masked_fill(~mask, -torch.inf).max(-1, keepdim=True).values
        if rule.lower is not None:
            ok = (stat >= math.log(rule.lower)) & (stat <= math.log(rule.upper))
        else:
            ok = stat <= rule.upper
        keep &= ok.expand_as(mask)
    rejected = mask & ~keep
    rows = mask.any(-1)
    return keep, {
        "rollout_corr/rollout_rs_masked_fraction": masked_mean(rejected.to(log_ratio.dtype), mask),
        "rollout_corr/rollout_rs_seq_masked_fraction": masked_mean(rejected.any(-1).to(log_ratio.dtype), rows),
    }


def apply_correction(
    trainer_log_probs: torch.Tensor,  # [B, T] the trainer's log-probs of the sampled tokens (detached)
    rollout_log_probs: torch.Tensor,  # [B, T] the engine's
    response_mask: torch.Tensor,  # [B, T]
    corr: RolloutCorrection,
) -> Correction:
    """IS weights (None unless the loss is to be reweighted) and the keep mask for one micro-batch.

    Off (no rollout_is, no rollout_rs) the weights still yield their metrics at token level with
    rollout_is_threshold, so a run shows what turning the correction on would do."""
    log_ratio = trainer_log_probs.detach() - rollout_log_probs
    weights, metrics = is_weights(log_ratio, response_mask, corr.rollout_is or "token", corr.rollout_is_threshold,
                                  corr.rollout_is_batch_normalize and corr.rollout_is is not None)
    keep, rs_metrics = rejection_mask(log_ratio, response_mask, corr.rejection)
    metrics.update(rs_metrics)
    return Correction(weights if corr.reweights else None, keep, metrics)


@torch.no_grad()
def mismatch_metrics(
    trainer_log_probs: torch.Tensor,  # [B, T]
    rollout_log_probs: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
) -> dict[str, torch.Tensor]:
    """How far the engine's policy is from the trainer's on the sampled tokens (verl's off-policy metrics):

    kl           mean over tokens of log pi_rollout - log pi_trainer: KL(rollout || trainer), k1 estimate
    k3_kl        mean of r - 1 - log r, r = pi_trainer / pi_rollout: the same KL, never negative
    log_ppl_diff mean over responses of (mean log pi_rollout - mean log pi_trainer): the log-perplexity gap
    log_ppl_abs_diff, training_log_ppl, rollout_log_ppl, chi2_token (E[r^2] - 1, the IS weights' variance)
    """
    mask = as_bool_mask(response_mask)
    rows = mask.any(-1)
    count = mask.sum(-1).clamp(min=1)
    log_ratio = (trainer_log_probs - rollout_log_probs).masked_fill(~mask, 0.0)
    trainer_lp = masked_sum(trainer_log_probs, mask, dim=-1) / count  # [B]
    rollout_lp = masked_sum(rollout_log_probs, mask, dim=-1) / count
    gap = rollout_lp - trainer_lp
    r = _clamped_exp(log_ratio)
    # k3 unclamped, as verl, in float64: equal to verl's wherever its float32 is finite.
    k3 = torch.expm1(log_ratio.double()) - log_ratio.double()
    return {
        "rollout_corr/kl": masked_mean(-log_ratio, mask),
        "rollout_corr/k3_kl": masked_mean(k3, mask).to(log_ratio.dtype),
        "rollout_corr/log_ppl_diff": masked_mean(gap, rows),
        "rollout_corr/log_ppl_abs_diff": masked_mean(gap.abs(), rows),
        "rollout_corr/training_log_ppl": masked_mean(-trainer_lp, rows),
        "rollout_corr/rollout_log_ppl": masked_mean(-rollout_lp, rows),
        "rollout_corr/chi2_token": masked_mean(r.square(), mask) - 1.0,
    }
