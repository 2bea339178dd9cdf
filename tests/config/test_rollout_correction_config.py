"""algorithm.rollout_correction and the policy losses' keys: what validates, what is refused in one line."""

from __future__ import annotations

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR

CORR = "algorithm.rollout_correction"


@pytest.mark.parametrize("overrides, needles", [
    ([f"{CORR}.rollout_is=tokens"], [f"{CORR}.rollout_is=tokens", "token, sequence"]),
    ([f"{CORR}.rollout_is_threshold=0"], [f"{CORR}.rollout_is_threshold=0", "> 0"]),
    ([f"{CORR}.rollout_rs=geometric"], [f"{CORR}.rollout_rs=geometric", "needs rollout_rs_threshold"]),
    ([f"{CORR}.rollout_rs=token_k2", f"{CORR}.rollout_rs_threshold=0.5_2.0"], [f"{CORR}.rollout_rs_threshold=",
                                                                           "not a bound for token_k2"]),
    ([f"{CORR}.loss_type=reinforce"], [f"{CORR}.loss_type=reinforce", f"{CORR}.bypass_mode=true"]),
    ([f"{CORR}.loss_type=pg"], [f"{CORR}.loss_type=pg", "ppo_clip, reinforce"]),
    ([f"{ARR}.actor.policy_loss.loss_mode=gmpo"], ["loss_mode=gmpo", "geo_mean"]),
    ([f"{ARR}.actor.policy_loss.kl_cov_ratio=0"], ["kl_cov_ratio=0", "> 0"]),
])
def test_bad_values_are_refused_in_one_line(data_files, overrides, needles):
    with pytest.raises(ConfigError) as err:
        validate(compose([*data_files, *overrides]))
    message = str(err.value)
    assert "\n" not in message and all(n in message for n in needles), message


def test_the_default_is_token_tis_at_two_and_keeps_the_old_log_prob_plan(data_files):
    cfg, _, plan = validate(compose([*data_files, f"{ARR}.actor.ppo_epochs=2"]))
    corr = cfg.algorithm.rollout_correction
    assert (corr.rollout_is, corr.rollout_is_threshold, corr.rollout_rs, corr.bypass_mode) == ("token", 2.0, None,
                                                                                            False)
    assert plan.runs("old_log_prob")  # decoupled: pi_old is the trainer's own
    _, _, bypass = validate(compose([*data_files, f"{ARR}.actor.ppo_epochs=2", f"{CORR}.bypass_mode=true"]))
    assert not bypass.runs("old_log_prob")


def test_a_verl_loss_name_and_rejection_rules_validate(data_files):
    cfg, _, _ = validate(compose([*data_files, f"{ARR}.actor.policy_loss.loss_mode=geo_mean",
                                  f"{CORR}.rollout_rs='token,geometric'",
                                  f"{CORR}.rollout_rs_threshold='0.5_2.0,0.99_1.01'"]))
    assert cfg[ARR].actor.policy_loss.loss_mode == "geo_mean"
    assert cfg.algorithm.rollout_correction.rollout_rs == "token,geometric"


def test_bypass_reinforce_says_once_that_it_replaces_the_configured_loss(data_files, caplog):
    bypass = [f"{CORR}.bypass_mode=true", f"{CORR}.loss_type=reinforce"]
    with caplog.at_level("INFO", logger="logicrl.config"):
        validate(compose([*data_files, *bypass, f"{ARR}.actor.policy_loss.loss_mode=cispo"]))
    said = [r.message for r in caplog.records if "in place of" in r.message]
    assert len(said) == 1 and "loss_mode gpg" in said[0] and "loss_mode=cispo" in said[0]
