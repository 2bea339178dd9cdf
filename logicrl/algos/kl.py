"""KL estimators and the two ways KL to the reference policy enters training.

Estimators (KL_ESTIMATORS, chosen by `actor_rollout_ref.actor.kl_loss_type` and `algorithm.kl_penalty`)
estimate KL(pi || pi_ref) per token from samples of pi, following Schulman, "Approximating KL
Divergence" (2020, http://joschu.net/blog/kl-approx.html), with d = log pi - log pi_ref:

    kl, k1          k1 = d                       unbiased, high variance, can be negative
    abs             |d|
    mse, k2         k2 = d^2 / 2                 biased, low variance
    low_var_kl, k3  k3 = exp(-d) - 1 + d         unbiased, >= 0, low variance; clamped like verl

Each answers to both of verl's names (older `kl`/`mse`/`low_var_kl`, newer `k1`/`k2`/`k3`). As a loss
term (actor.use_kl_loss, GRPO's choice): `kl_loss_coef * kl_penalty(...)` added to the token losses. As a
reward penalty (algorithm.use_kl_in_reward): `apply_kl_penalty` subtracts beta * KL from the token-level
scores before the advantage, beta from a KL controller (KL_CONTROLLERS, by `algorithm.kl_ctrl.type`).
"""

from __future__ import annotations

import torch

from logicrl import algo_names
from logicrl.algos.masked import as_bool_mask, masked_fill_zero, masked_mean
from logicrl.algos.registry import Registry

KL_ESTIMATORS = Registry("KL estimator (actor.kl_loss_type / algorithm.kl_penalty)",
                         inputs=("log_probs", "ref_log_probs"), names=algo_names.KL_ESTIMATORS)
register_kl_estimator = KL_ESTIMATORS.register

# k3's exp(-d) overflows for large |d|; verl clamps d to +-20 before exp and k3 itself to +-10,
# which bounds the gradient a single runaway token can contribute. Kept for parity with verl runs.
K3_LOG_RATIO_CLAMP = 20.0
K3_CLAMP = 10.0


@register_kl_estimator("k1")
@register_kl_estimator("kl")
def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T]
    return log_probs - ref_log_probs


@register_kl_estimator("abs")
def kl_abs(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T]
    return (log_probs - ref_log_probs).abs()


@register_kl_estimator("k2")
@register_kl_estimator("mse")
def kl_k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T]
    return 0.5 * (log_probs - ref_log_probs) ** 2


@register_kl_estimator("k3")
@register_kl_estimator("low_var_kl")
def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:  # [B, T] -> [B, T]
    log_ratio = (ref_log_probs - log_probs).clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(log_ratio) - log_ratio - 1).clamp(-K3_CLAMP, K3_CLAMP)


def kl_penalty(
    log_probs: torch.Tensor,  # [B, T]
    ref_log_probs: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    kl_type: str,
) -> torch.Tensor:  # [B, T], 0 at masked positions
    """Per-token KL estimate by the estimator named `kl_type` (see KL_ESTIMATORS)."""
    mask = as_bool_mask(response_mask)
    kl = KL_ESTIMATORS.call(kl_type, log_probs=masked_fill_zero(log_probs, mask),
                            ref_log_probs=masked_fill_zero(ref_log_probs, mask))
    return masked_fill_zero(kl, mask)


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,  # [B, T] rule rewards (usually on the last token)
    old_log_probs: torch.Tensor,  # [B, T] the sampling policy
    ref_log_probs: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    kl_coef: float,
    kl_type: str,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([B, T] token_level_rewards, 0-dim mean KL)
    """KL as a reward penalty: r_t = score_t - beta * KL_t (Ziegler et al. 2019, arXiv:1909.08593;
    Ouyang et al. 2022, InstructGPT), as verl's apply_kl_penalty.

    Returns the rewards and the batch KL, the mean over sequences of each sequence's per-token mean
    (verl's `actor/reward_kl_penalty`), to feed the controller's update and the metrics.
    """
    mask = as_bool_mask(response_mask)
    kl = kl_penalty(old_log_probs, ref_log_probs, mask, kl_type)
    rewards = masked_fill_zero(token_level_scores - kl_coef * kl, mask)
    has_tokens = mask.any(dim=-1)
    mean_kl = masked_mean(masked_mean(kl, mask, dim=-1), has_tokens)
    return rewards, mean_kl


KL_CONTROLLERS = Registry("algorithm.kl_ctrl.type", inputs=("kl_coef", "target_kl", "horizon"),
                          names=algo_names.KL_CONTROLLERS)
register_kl_controller = KL_CONTROLLERS.register


@register_kl_controller("fixed")
class FixedKLController:
    """beta stays kl_coef. The only state is `value` (checkpoint it with the trainer state)."""

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing to do: the coefficient is fixed."""


@register_kl_controller("adaptive")
class AdaptiveKLController:
    """Ziegler et al. 2019 (arXiv:1909.08593, section 2.2), as verl/trl implement it:

        e = clip(current_kl / target_kl - 1, -0.2, 0.2),   beta <- beta * (1 + e * n_steps / horizon)

    The paper's K_beta is n_steps / horizon here: `n_steps` is the number of responses the KL was
    measured on (verl passes the batch size), so `horizon` is counted in responses and the
    coefficient moves at the same rate per sample whatever the batch size. The clip bounds one
    update to +-20% of the horizon rate, so one noisy batch cannot swing beta.
    """

    def __init__(self, kl_coef: float, target_kl: float, horizon: int):
        if target_kl <= 0 or horizon < 1:
            raise ValueError(f"adaptive KL controller needs target_kl > 0 and horizon >= 1; got {target_kl}, {horizon}")
        self.value = float(kl_coef)
        self.target_kl = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target_kl - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


def make_kl_controller(kl_ctrl_type: str, *, kl_coef: float, target_kl: float | None = None,
                       horizon: int | None = None) -> FixedKLController | AdaptiveKLController:
    """The controller named `kl_ctrl_type` (see KL_CONTROLLERS), from algorithm.kl_ctrl's values."""
    return KL_CONTROLLERS.call(kl_ctrl_type, kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
