"""The rewards a validated config scores with: reward.combine as a rule, and the check each data row
must pass to be scorable (its data_source has a reward, its ground truth reads).

    rule = combine_rule(cfg)         # None without a reward model: the rules alone score
    row_check = reward_check(cfg)    # for data.dataset's loads: the preflight's sample, the trainer's full load

The row check is built here once so the preflight's look at a sample and the trainer's load of
every row refuse a row with the same line.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from logicrl.reward import REWARD_FNS, ground_truth_problem
from logicrl.reward.combine import CombineRule


def combine_rule(cfg: DictConfig) -> CombineRule | None:
    """reward.combine as a rule (validated by config/validate.py), or None without a reward model:
    then the rules alone score."""
    if not cfg.reward_model.enable:
        return None
    c = cfg.reward.combine
    return CombineRule.from_config(c.mode, _plain(c.weights), _plain(c.by_data_source) or None)


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def reward_check(cfg: DictConfig):
    """The row check for the rewards this run uses: a custom reward takes every data_source and
    its ground truth is its own business (calling it here could be slow or have side effects).
    A data_source with no rule reward passes only where reward.combine scores it by the reward
    model alone; elsewhere its row is refused with the ways to score it."""
    if cfg.reward.custom.path:
        return None
    rule = combine_rule(cfg)
    by_source = _plain(cfg.reward.combine.by_data_source) or {}

    def check(data_source: str, ground_truth) -> str | None:
        if data_source in REWARD_FNS:
            return ground_truth_problem(data_source, ground_truth)
        if rule is not None and not rule.needs_rule(data_source):
            return None  # the reward model's score alone; no rule to read the ground truth
        override = f"reward.combine.by_data_source.{data_source}=model"
        if rule is None:
            return (f"no rule reward for data_source={data_source!r} (known: {sorted(REWARD_FNS)}): score it by a "
                    f"reward model alone (reward_model.enable=true, reward_model.model.path, {override}), register "
                    f"a rule with @logicrl.reward.register({data_source!r}), or set reward.custom.path/name")
        entry = by_source.get(data_source)
        key = (f"reward.combine.mode={cfg.reward.combine.mode}" if entry is None else
               f"reward.combine.by_data_source.{data_source}" + (f"={entry}" if isinstance(entry, str) else ""))
        return (f"no rule reward for data_source={data_source!r} (known: {sorted(REWARD_FNS)}), but {key} weighs "
                f"one in (rule weight {rule.weights(data_source).rule:g}): set {override} to score it by the reward "
                f"model alone, or register a rule with @logicrl.reward.register({data_source!r})")

    return check
