"""The registries: names agree with the config's choices, lookups fail with a usable message."""

from __future__ import annotations

import dataclasses

import pytest
import torch

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


def test_registry_names_equal_the_choices_the_config_validates():
    # The config rejects unknown names up front; a name it accepts must exist here, and a name
    # registered here must be reachable from a config.
    assert sorted(ADV_ESTIMATORS) == sorted(schema.ADV_ESTIMATORS)
    assert sorted(KL_ESTIMATORS) == sorted(schema.KL_ESTIMATORS)
    assert sorted(AGG_MODES) == sorted(schema.LOSS_AGG_MODES)
    kl_ctrl_type = next(f for f in dataclasses.fields(schema.KLCtrlConfig) if f.name == "type")
    assert sorted(KL_CONTROLLERS) == sorted(kl_ctrl_type.metadata["choices"])


def test_policy_loss_modes():
    # No schema key for loss_mode yet; this pins the two modes the issue asks for.
    assert sorted(POLICY_LOSSES) == sorted(schema.POLICY_LOSS_MODES)


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
