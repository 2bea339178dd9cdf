"""The names each algorithm switch accepts, one list per switch, read by the schema and the registries.

A torch-free module outside algos/: config/ validates a config before any model loads and imports no
torch (a refused or dry run is one line in about a second, docs/testing.md), while importing anything
under logicrl/algos/ runs its __init__, which imports torch. config/schema.py takes its `choices` from
these lists; each `Registry` in algos/ is built with its list, and registering a name the list lacks
adds it, so a loss registered from a user's module (actor_rollout_ref.actor.policy_loss.module, imported
before validation) is a valid choice. tests/algos/test_algos_registry.py checks each list names exactly
the implementations algos/ registers.
"""

from __future__ import annotations

# algorithm.adv_estimator (algos/advantages.py)
ADV_ESTIMATORS = ["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]
# actor.kl_loss_type and algorithm.kl_penalty (algos/kl.py): verl spells the same three estimators two ways.
KL_ESTIMATORS = ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"]
# algorithm.kl_ctrl.type (algos/kl.py)
KL_CONTROLLERS = ["fixed", "adaptive"]
# actor.loss_agg_mode (algos/aggregation.py)
LOSS_AGG_MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
# actor.policy_loss.loss_mode (algos/policy_loss.py, policy_loss_cov.py)
POLICY_LOSS_MODES = ["vanilla", "gspo", "cispo", "geo_mean", "sapo", "gpg", "clip_cov", "kl_cov"]
