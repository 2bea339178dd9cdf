"""Every config group and recipe composes, and the YAML and the typed schema stay in step."""

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from logicrl.config import compose, validate
from logicrl.config.cli import CONF_DIR, recipe_names
from logicrl.config.schema import RootConfig

GROUPS = ["data", "actor_rollout_ref", "critic", "reward_model", "algorithm", "reward", "trainer"]


def test_primary_config_has_every_group():
    cfg = compose()
    assert set(GROUPS) <= set(cfg.keys())


@pytest.mark.parametrize("group", GROUPS)
def test_every_group_option_composes(group, data_files):
    options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
    assert options, f"conf/{group} has no options"
    for option in options:
        typed, _, _ = validate(compose([f"{group}={option}", *data_files]))
        assert OmegaConf.is_config(typed[group])


@pytest.fixture
def files_only(data_files):
    """Just the data paths: recipes set their own batch sizes, and the command line would win."""
    return data_files[:2]


def test_recipes_are_found_nested_too():
    assert {"stage1", "stage2", "ablation/grpo_stage1"} <= set(recipe_names())


@pytest.mark.parametrize("recipe", recipe_names())
def test_every_recipe_composes_and_validates(recipe, files_only):
    typed, _, plan = validate(compose([f"+recipe={recipe}", *files_only]))
    assert typed.algorithm.adv_estimator in ("reinforce_plus_plus", "grpo", "gae")
    assert plan.responses == typed.data.train_batch_size * typed.actor_rollout_ref.rollout.n


def test_recipes_carry_logic_rl_published_settings(files_only):
    s1, _, _ = validate(compose(["+recipe=stage1", *files_only]))
    s2, _, _ = validate(compose(["+recipe=stage2", *files_only]))
    assert (s1.data.train_batch_size, s1.actor_rollout_ref.rollout.n) == (8, 32)
    assert (s2.data.train_batch_size, s2.actor_rollout_ref.rollout.n) == (4, 64)
    for s in (s1, s2):
        arr = s.actor_rollout_ref
        assert s.algorithm.adv_estimator == "reinforce_plus_plus"
        assert arr.actor.use_kl_loss and arr.actor.kl_loss_type == "low_var_kl" and arr.actor.kl_loss_coef == 0.001
        assert arr.actor.optim.lr == 4e-7 and arr.rollout.temperature == 0.7
        assert s.data.max_response_length == 4096
        # Logic-RL's mini-batch of 256 prompts is clamped to the train batch.
        assert arr.actor.ppo_mini_batch_size == s.data.train_batch_size


def test_nested_recipe_overlays_its_parent(files_only):
    typed, _, _ = validate(compose(["+recipe=ablation/grpo_stage1", *files_only]))
    assert typed.algorithm.adv_estimator == "grpo"
    assert typed.actor_rollout_ref.rollout.n == 32  # from stage1


def test_command_line_beats_recipe(files_only):
    typed, _, _ = validate(compose(["+recipe=stage1", "actor_rollout_ref.rollout.n=16", *files_only]))
    assert typed.actor_rollout_ref.rollout.n == 16


def test_yaml_supplies_every_schema_key_and_no_other():
    # validate() would raise on an extra YAML key; a schema key the YAML forgot stays MISSING.
    merged = OmegaConf.merge(OmegaConf.structured(RootConfig), compose())
    assert OmegaConf.missing_keys(merged) == set()


def test_every_yaml_key_has_a_comment_above_it():
    files = list(CONF_DIR.rglob("*.yaml")) + list(Path(CONF_DIR.parent / "recipes").rglob("*.yaml"))
    for path in files:
        if "recipes" in path.parts:
            # Recipes are thin overlays of documented keys; they must open with the command that runs them.
            assert re.search(r"^# Run: python main_ppo\.py \+recipe=", path.read_text(), re.M), path
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"^\s*[A-Za-z_][\w]*:", line):
                assert i > 0 and lines[i - 1].strip().startswith("#"), f"{path}:{i + 1} `{line.strip()}` has no comment"
