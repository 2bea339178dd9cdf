"""Pure tensor math for the RL step: advantages, policy/value losses, aggregation, KL, shaping,
rollout correction.

Tensors in, tensors out: no Ray, tokenizer or config objects. Each behaviour a config string
selects lives in one registry (ADV_ESTIMATORS, POLICY_LOSSES, AGG_MODES, KL_ESTIMATORS,
KL_CONTROLLERS) whose names equal the choices logicrl/config/schema.py validates. Conventions:
B = responses (prompts x rollout.n), T = response tokens, `response_mask` [B, T] is the loss mask
(the tokens that train; verl's name), and values at masked positions never change a result. How a
loss is split over micro-batches without changing its gradient: see aggregation.py.
"""

from logicrl.algos.advantages import (
    ADV_ESTIMATORS,
    compute_advantage,
    gae_advantage,
    group_stats,
    grpo_advantage,
    register_adv_estimator,
    reinforce_plus_plus_advantage,
    reinforce_plus_plus_baseline_advantage,
    rloo_advantage,
    uids_to_index,
)
from logicrl.algos.aggregation import AGG_MODES, agg_loss, loss_normalizer, register_agg_mode
from logicrl.algos.kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    kl_penalty,
    make_kl_controller,
    register_kl_controller,
    register_kl_estimator,
)
from logicrl.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten
from logicrl.algos.metrics import (
    advantage_metrics,
    approx_kl_metrics,
    entropy_metrics,
    masked_stats,
    policy_clip_metrics,
    value_clip_metrics,
)
from logicrl.algos.policy_loss import (
    POLICY_LOSSES,
    PolicyLossOutput,
    cispo_policy_loss,
    compute_policy_loss,
    entropy_bonus,
    gmpo_policy_loss,
    gpg_policy_loss,
    gspo_policy_loss,
    register_policy_loss,
    sapo_policy_loss,
    vanilla_policy_loss,
)
from logicrl.algos.policy_loss_cov import clip_cov_policy_loss, kl_cov_policy_loss
from logicrl.algos.registry import Registry
from logicrl.algos.rollout_correction import (
    Correction,
    RolloutCorrection,
    apply_correction,
    mismatch_metrics,
    parse_rejection,
)
from logicrl.algos.shaping import overlong_penalty
from logicrl.algos.value_loss import ValueLossOutput, value_loss

__all__ = [
    "ADV_ESTIMATORS", "AGG_MODES", "KL_CONTROLLERS", "KL_ESTIMATORS", "POLICY_LOSSES",
    "AdaptiveKLController", "Correction", "FixedKLController", "RolloutCorrection", "PolicyLossOutput", "Registry",
    "ValueLossOutput",
    "advantage_metrics", "agg_loss", "apply_correction", "cispo_policy_loss", "clip_cov_policy_loss",
    "gmpo_policy_loss", "gpg_policy_loss", "kl_cov_policy_loss", "mismatch_metrics", "parse_rejection",
    "sapo_policy_loss", "apply_kl_penalty", "approx_kl_metrics", "compute_advantage",
    "compute_policy_loss", "entropy_bonus", "entropy_metrics", "gae_advantage", "group_stats",
    "grpo_advantage", "gspo_policy_loss", "kl_penalty", "loss_normalizer", "make_kl_controller",
    "masked_mean", "masked_stats", "masked_sum", "masked_var", "masked_whiten", "overlong_penalty",
    "policy_clip_metrics", "register_adv_estimator", "register_agg_mode", "register_kl_controller",
    "register_kl_estimator", "register_policy_loss", "reinforce_plus_plus_advantage",
    "reinforce_plus_plus_baseline_advantage", "rloo_advantage", "uids_to_index", "value_clip_metrics",
    "value_loss", "vanilla_policy_loss",
]
