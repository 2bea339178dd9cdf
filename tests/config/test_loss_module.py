"""A user's loss module (actor_rollout_ref.actor.policy_loss.module): its losses become choices, its
parameters keys under policy_loss, checked against the selected loss; one line for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from logicrl.config import validate
from logicrl.config.cli import check_overrides, compose
from logicrl.config.errors import ConfigError
from logicrl.config.phases import ARR

USER_LOSS = Path(__file__).resolve().parents[1] / "trainer" / "user_loss.py"
GROUP = f"{ARR}.actor.policy_loss"
WITH_MODULE = [f"{GROUP}.module={USER_LOSS}", f"{GROUP}.loss_mode=offset_pg"]


def validated(data_files, *overrides: str):
    return validate(compose([*data_files, *overrides]))[0]


def test_the_user_loss_and_its_parameter_reach_the_validated_config(data_files):
    cfg = validated(data_files, *WITH_MODULE, f"+{GROUP}.loss_offset=0.375")
    assert cfg[ARR].actor.policy_loss.loss_mode == "offset_pg"
    assert cfg[ARR].actor.policy_loss.loss_offset == 0.375
    assert cfg[ARR].actor.policy_loss.clip_cov_ratio == 0.0002  # the schema's keys stay


def test_a_relative_module_path_is_made_absolute_for_the_ranks(data_files, monkeypatch):
    monkeypatch.chdir(USER_LOSS.parent)
    cfg = validated(data_files, f"{GROUP}.module=user_loss.py", f"{GROUP}.loss_mode=offset_pg",
                    f"+{GROUP}.loss_offset=0.375")
    assert cfg[ARR].actor.policy_loss.module == str(USER_LOSS)


def test_a_parameter_key_without_a_module_is_an_unknown_key(data_files):
    with pytest.raises(ConfigError, match=f"unknown config key `{GROUP}.loss_offset`.*{GROUP}.module"):
        validated(data_files, f"+{GROUP}.loss_offset=0.375")


def test_a_key_the_selected_loss_does_not_take_is_refused(data_files):
    with pytest.raises(ConfigError, match=f"{GROUP}.loss_ofset is not a parameter of loss_mode=offset_pg"):
        validated(data_files, *WITH_MODULE, f"+{GROUP}.loss_offset=0.375", f"+{GROUP}.loss_ofset=1")


def test_a_required_parameter_left_unset_is_named(data_files):
    with pytest.raises(ConfigError, match=f"loss_mode=offset_pg needs loss_offset: set \\+{GROUP}.loss_offset="):
        validated(data_files, *WITH_MODULE)


def test_a_missing_module_file_is_one_line(data_files, tmp_path):
    with pytest.raises(ConfigError, match=f"{GROUP}.module=.*nope.py is not a file"):
        validated(data_files, f"{GROUP}.module={tmp_path}/nope.py")


def test_an_unknown_loss_name_lists_the_choices(data_files):
    with pytest.raises(ConfigError, match="loss_mode=offset_pgg is not one of: vanilla, gspo"):
        validated(data_files, f"{GROUP}.loss_mode=offset_pgg")


def test_a_new_key_without_plus_says_how_to_add_it():
    with pytest.raises(ConfigError, match=f"unknown config key `{GROUP}.loss_offset`: .* \\+{GROUP}.loss_offset=..."):
        check_overrides([f"{GROUP}.loss_offset=0.375"])


def test_a_key_the_actor_already_passes_is_refused(data_files):
    with pytest.raises(ConfigError, match=f"{GROUP}.clip_ratio_c: the actor passes clip_ratio_c .*{ARR}.actor"):
        validated(data_files, *WITH_MODULE, f"+{GROUP}.loss_offset=0.375", f"+{GROUP}.clip_ratio_c=2")


def test_verls_spelling_of_sapos_temperatures_lands_on_the_actors_keys(data_files):
    # verl's SAPO scripts set them under policy_loss; its loss (and logicrl's) reads the actor's.
    cfg = validated(data_files, *WITH_MODULE, f"+{GROUP}.loss_offset=0.375", f"+{GROUP}.tau_pos=2")
    assert cfg[ARR].actor.tau_pos == 2 and "tau_pos" not in cfg[ARR].actor.policy_loss
