"""Every key verl's current example scripts set is honoured, mapped, ignored with a reason or refused with one.

verl_examples.json holds the overrides each of verl's example scripts (the ones that launch main_ppo) passes,
recorded by running the scripts with bash. Each key must be one of logicrl's (the schema, Hydra's own) or
have a rule in config/verl_keys.py; each rule says what it did in one line or raises ConfigError with the
reason. A key with neither would be an unknown-key error that says nothing about verl: none may be left.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from logicrl.config import ConfigError, check_overrides
from logicrl.config.cli import list_item
from logicrl.config.schema import all_keys
from logicrl.config.verl_keys import VERL_KEYS, verl_rule_key

EXAMPLES = json.loads((Path(__file__).parent / "verl_examples.json").read_text())["scripts"]
HYDRA_FLAGS = ("--config-name", "--config-path")  # read by Hydra itself: a config verl's recipes ship


def plain(override) -> object:
    value = override.value()
    return OmegaConf.to_container(OmegaConf.create({"v": value}))["v"] if not isinstance(value, str) else value


def outcomes(overrides: list[str], caplog) -> dict[str, str]:
    """key -> honoured | mapped | ignored | refused, for one script's overrides (a subtree rule's keys are
    handed to it together, as validate does)."""
    valid, result, subtrees, context = set(all_keys()), {}, defaultdict(dict), OmegaConf.create()
    for arg in overrides:
        if arg.startswith("-"):
            assert arg.split("=", 1)[0] in HYDRA_FLAGS, arg
            continue
        o = OverridesParser.create().parse_override(arg)
        key = o.key_or_group
        if o.package:  # verl's `group@package=option`
            with pytest.raises(ConfigError, match="selects verl's config group"):
                check_overrides([arg])
            result[arg.split("=", 1)[0]] = "refused"
        elif key in valid or list_item(key, valid) or key.startswith("hydra."):
            result[key] = "honoured"
            if key in valid:
                OmegaConf.update(context, key, plain(o), force_add=True)
        elif rule := verl_rule_key(key):
            leaf = key[len(rule) + 1:]
            if leaf:
                OmegaConf.update(subtree := OmegaConf.create(subtrees[rule] or {}), leaf, plain(o), force_add=True)
                subtrees[rule] = OmegaConf.to_container(subtree)
            else:
                subtrees[rule] = plain(o)
            result[key] = rule
        else:
            result[key] = "unknown"
    for rule, value in subtrees.items():
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="logicrl.config"):
            try:
                mapped = VERL_KEYS[rule](rule, value, *[context] if getattr(VERL_KEYS[rule], "reads_config", 0) else [])
            except ConfigError as err:
                said, outcome = str(err), "refused"
            else:
                said = " ".join(r.getMessage() for r in caplog.records)
                outcome = "mapped" if mapped else "ignored"
        assert said and "\n" not in said, (rule, value, said)  # one line, always
        for key in [k for k, r in result.items() if r == rule]:
            result[key] = outcome
    return result


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_every_key_a_verl_example_sets_has_an_outcome(script, caplog):
    found = outcomes(EXAMPLES[script], caplog)
    assert sorted(k for k, o in found.items() if o == "unknown") == []


def test_the_examples_cover_what_the_rules_are_for(caplog):
    # Every outcome occurs, and the keys verl's scripts set most are logicrl's own.
    counts = defaultdict(int)
    for overrides in EXAMPLES.values():
        for outcome in outcomes(overrides, caplog).values():
            counts[outcome] += 1
    assert set(counts) == {"honoured", "mapped", "ignored", "refused"}
    assert counts["honoured"] > sum(counts.values()) / 2, dict(counts)


# ---------------------------------------------------------------- dry runs of the FSDP text-only examples
# The examples that train a text model with FSDP on features logicrl has, dry-run as main_ppo.py runs them
# (tests/conftest.py check_main) with the model and data paths changed: kk_role's data, a shape config (no
# weights) of the script's model where its tensor parallelism needs one, else Qwen2.5-7B's, and the reward
# model a Llama-3.1-8B-shaped classifier. On 80 GB devices.
PASS = [
    "ascend_extras/grpo_trainer/run_qwen3_32b_fsdp.sh", "ascend_extras/gspo_trainer/run_qwen3_32b_fsdp.sh",
    "ascend_extras/ppo_trainer/run_qwen3_8b_fsdp.sh", "cispo_trainer/run_qwen3_8b_fsdp.sh",
    "gmpo_trainer/run_qwen3_8b_fsdp.sh", "grpo_trainer/run_mistral_nemo_12b_skyworkrm_fsdp.sh",
    "grpo_trainer/run_qwen2_5_32b_fsdp.sh", "grpo_trainer/run_qwen3_4b_fsdp.sh", "grpo_trainer/run_qwen3_8b_fsdp.sh",
    "grpo_trainer/run_seed_oss_36b_fsdp.sh", "gspo_trainer/run_qwen3_8b_fsdp.sh", "ppo_trainer/run_qwen3_8b_fsdp.sh",
    "prefix_grouper/run_qwen3_8b_fsdp.sh", "profile/run_qwen2_5_7b_torch_profile.sh",
    "profile/run_qwen3_8b_npu_profile_discrete.sh", "profile/run_qwen3_8b_npu_profile_e2e.sh",
    "reinforce_plus_plus_trainer/run_qwen3_8b_fsdp.sh", "rloo_trainer/run_qwen3_8b_fsdp.sh",
    "sapo_trainer/run_qwen3_8b_fsdp.sh", "tuning/lora/run_qwen3_8b_fsdp.sh", "tuning/scaling/run_qwen2_5_72b_fsdp.sh",
]
# FSDP text-only examples refused, each at the override its one line names (what logicrl does not implement).
REFUSED = {
    "gdpo_trainer/run_qwen3_8b_fsdp.sh": "algorithm.gdpo_reward_keys",
    "gpg_trainer/run_qwen3_8b_fsdp.sh": "algorithm.adv_estimator=gpg",
    "otb_trainer/run_qwen3_8b_fsdp.sh": "actor_rollout_ref.actor.calculate_sum_pi_squared=True",
    "remax_trainer/run_qwen2.5_math_7b_sync_fsdp.sh": "algorithm.adv_estimator=remax",
    "remax_trainer/run_qwen3_8b_fsdp.sh": "algorithm.adv_estimator=remax",
    "on_policy_distillation_trainer/run_qwen3_8b_fsdp.sh": "distillation.enabled=True",
    "tuning/lora/run_qwen3_8b_from_adapter_fsdp.sh": "actor_rollout_ref.model.lora_adapter_path",
    "tuning/lora/run_qwen3_8b_merge_fsdp.sh": "actor_rollout_ref.actor.fsdp_config.model_dtype=bf16",
    # verl runs a group estimator on groups of one (n is left at 1); logicrl asks for n >= 2.
    "rollout_correction/run_qwen2_5_7b_fsdp.sh": "actor_rollout_ref.rollout.n >= 2",
    "rollout_correction/run_qwen2_5_7b_fsdp_multi_rs.sh": "actor_rollout_ref.rollout.n >= 2",
}
# Qwen2.5-32B's and -72B's shapes: their scripts' rollout tensor parallelism (8, 16) divides their heads, not 7B's 28.
WIDE = {"Qwen/Qwen2.5-32B": dict(hidden_size=5120, intermediate_size=27648, num_attention_heads=40,
                                 num_hidden_layers=64),
        "Qwen/Qwen2.5-72B-Instruct": dict(hidden_size=8192, intermediate_size=29568, num_attention_heads=64,
                                          num_hidden_layers=80)}


def shape(model: str, tmp_path: Path) -> str:
    from tests.conftest import ROOT

    base = ROOT / "logicrl/memory/shapes/qwen2.5-7b"
    if model not in WIDE:
        return str(base)
    config = {**json.loads((base / "config.json").read_text()), **WIDE[model]}
    path = tmp_path / model.replace("/", "_")
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def changed(script: str, tmp_path: Path) -> list[str]:
    from tests.config.test_verl_scripts import llama3_rm_shape
    from tests.conftest import ROOT

    args = EXAMPLES[f"examples/{script}"]
    model = next(a.split("=", 1)[1] for a in args if a.lstrip("+").startswith("actor_rollout_ref.model.path="))
    actor = shape(model, tmp_path)
    paths = {"actor_rollout_ref.model.path": actor, "critic.model.path": actor,
             "data.train_files": str(ROOT / "data/kk_role/train.parquet"),
             "data.val_files": str(ROOT / "data/kk_role/test.parquet")}
    out = []
    for arg in args:
        key, _, _ = arg.partition("=")
        bare = key.lstrip("+")
        if bare in ("reward.reward_model.model_path", "reward_model.model.path"):
            out.append(f"{key}={llama3_rm_shape(tmp_path / 'rm')}")
        elif bare in paths:
            out.append(f"{key}={paths[bare]}")
        else:
            out.append(arg)
    return [*out, "trainer.dry_run=true", "trainer.gpu_memory_gb=80", "trainer.device=cuda",
            f"trainer.default_local_dir={tmp_path / 'ckpt'}"]


@pytest.mark.parametrize("script", PASS)
def test_an_fsdp_text_example_dry_runs_as_written(script, kk_role, tmp_path):
    from tests.conftest import check_main

    result = check_main(*changed(script, tmp_path), cwd=tmp_path)
    assert result.code == 0, result.line
    assert "logicrl dry run: the config is valid" in result.out


@pytest.mark.parametrize("script, override", sorted(REFUSED.items()))
def test_an_fsdp_text_example_with_what_logicrl_lacks_is_refused_naming_it(script, override, kk_role, tmp_path):
    from tests.conftest import assert_refused, check_main

    assert_refused(check_main(*changed(script, tmp_path), cwd=tmp_path), override)
