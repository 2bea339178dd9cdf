"""The registries: names agree with the config's choices, lookups fail with a usable message."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from logicrl import algo_names
from logicrl.algos import (
    ADV_ESTIMATORS,
    AGG_MODES,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
    compute_advantage,
    compute_policy_loss,
)
from logicrl.config import schema


def test_each_name_list_is_what_its_registry_implements_and_what_the_config_validates():
    # logicrl/algo_names.py holds the lists torch-free for config/; each registry adds what it registers
    # to its list, so equal lists mean every listed name has an implementation.
    assert sorted(ADV_ESTIMATORS) == sorted(algo_names.ADV_ESTIMATORS)
    assert sorted(KL_ESTIMATORS) == sorted(algo_names.KL_ESTIMATORS)
    assert sorted(KL_CONTROLLERS) == sorted(algo_names.KL_CONTROLLERS)
    assert sorted(AGG_MODES) == sorted(algo_names.LOSS_AGG_MODES)
    assert sorted(POLICY_LOSSES) == sorted(algo_names.POLICY_LOSS_MODES)
    choices = {name: f.metadata.get("choices") for name, f in schema.iter_fields()}
    assert choices["algorithm.adv_estimator"] is algo_names.ADV_ESTIMATORS
    assert choices["algorithm.kl_ctrl.type"] is algo_names.KL_CONTROLLERS
    assert choices["actor_rollout_ref.actor.policy_loss.loss_mode"] is algo_names.POLICY_LOSS_MODES


def test_a_registered_name_becomes_a_choice():
    names = ["a"]
    reg = Registry("test.switch", names=names)
    reg.register("b")(lambda x: x)
    assert names == ["a", "b"]


def test_each_built_in_loss_parameter_is_passed_by_the_dispatcher_or_a_config_key():
    # POLICY_LOSSES has no `inputs` list (a user's loss brings its own keys), so a misspelt parameter
    # of a built-in loss would silently keep its default: each must be something the actor passes.
    passed = set(inspect.signature(compute_policy_loss).parameters) - {"params", "loss_mode"}
    config_keys = {f.name for f in dataclasses.fields(schema.PolicyLossConfig)} | {"tau_pos", "tau_neg"}
    for mode in algo_names.POLICY_LOSS_MODES:
        if mode in POLICY_LOSSES and POLICY_LOSSES[mode].__module__.startswith("logicrl."):
            assert set(inspect.signature(POLICY_LOSSES[mode]).parameters) <= passed | config_keys, mode


@pytest.mark.parametrize("registry", [ADV_ESTIMATORS, POLICY_LOSSES, AGG_MODES, KL_ESTIMATORS, KL_CONTROLLERS])
def test_unknown_name_names_the_switch_and_lists_the_known_ones(registry):
    with pytest.raises(KeyError) as err:
        registry["no-such-thing"]
    message = str(err.value)
    assert registry.switch in message and "'no-such-thing'" in message
    assert all(repr(name) in message for name in registry)


def test_duplicate_registration_is_refused():
    reg = Registry("test.switch", inputs=("x",))
    reg.register("a")(lambda x: x)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(lambda x: x)


def test_parameters_outside_the_dispatcher_inputs_are_refused_at_registration():
    reg = Registry("test.switch", inputs=("token_level_rewards",))
    with pytest.raises(TypeError, match="declares \\['token_level_reward'\\]"):
        reg.register("typo")(lambda token_level_reward: token_level_reward)
    with pytest.raises(TypeError, match="name each argument"):
        reg.register("variadic")(lambda **kwargs: kwargs)


def test_call_passes_declared_inputs_only_and_reports_missing_ones():
    reg = Registry("test.switch", inputs=("a", "b", "c"))
    reg.register("ab")(lambda a, b=10: (a, b))
    assert reg.call("ab", a=1, b=2, c=3) == (1, 2)
    assert reg.call("ab", a=1, b=None, c=3) == (1, 10)  # None means "not given": the default applies
    with pytest.raises(TypeError, match="needs \\['a'\\]"):
        reg.call("ab", a=None, b=2)


def test_dispatchers_report_a_missing_input_by_name():
    rewards, mask = torch.zeros(2, 3), torch.ones(2, 3)
    with pytest.raises(TypeError, match="'gae' needs \\['values'\\]"):
        compute_advantage("gae", rewards, mask)
    with pytest.raises(TypeError, match="'grpo' needs \\['index'\\]"):
        compute_advantage("grpo", rewards, mask)
    with pytest.raises(KeyError, match="known"):
        compute_policy_loss("ppo", rewards, rewards, rewards, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
