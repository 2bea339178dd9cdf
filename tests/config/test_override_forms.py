"""Command-line forms Hydra alone would refuse or half-support (config/cli.py): a stage's overlay key
in any of `+`, `++` or plain form, whether the stage sets it or not; an item of a list-valued key;
and Hydra's composition errors reworded as one line."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from logicrl.config import ConfigError, check_overrides, compose
from logicrl.config.cli import for_hydra, hydra_error_line
from logicrl.config.phases import ARR
from logicrl.config.stages import build_stages
from tests.conftest import need_data


def test_a_stage_overlay_key_goes_to_hydra_as_add_or_set():
    assert for_hydra(["+curriculum.stages.1.overrides.data.train_batch_size=4",
                      "curriculum.stages.0.overrides.trainer.total_training_steps=3",
                      "++curriculum.stages.0.overrides.data.seed=1", "+data.train_batch_size=4"]) == [
        "++curriculum.stages.1.overrides.data.train_batch_size=4",
        "++curriculum.stages.0.overrides.trainer.total_training_steps=3",
        "++curriculum.stages.0.overrides.data.seed=1",
        "+data.train_batch_size=4"]  # not a stage's: Hydra's rule (and its one-line error) stand


def test_the_documented_stage_syntax_works_whether_the_stage_sets_the_key_or_not():
    need_data("kk_role_5ppl")
    # tiny_curriculum's stage 1 (index 1, "5ppl") sets train_batch_size: 8; neither stage sets max_prompt_length.
    args = ["+recipe=tiny_curriculum", "+curriculum.stages.1.overrides.data.train_batch_size=4",
            "+curriculum.stages.0.overrides.data.max_prompt_length=100", f"{ARR}.rollout.name=hf"]
    check_overrides(args)
    first, second = build_stages(compose(args), args)
    assert (first.cfg.data.train_batch_size, second.cfg.data.train_batch_size) == (16, 4)
    assert (first.cfg.data.max_prompt_length, second.cfg.data.max_prompt_length) == (100, 128)  # conf/'s 128


def test_an_item_of_a_list_key_is_not_an_unknown_key():
    check_overrides(["trainer.logger.0=jsonl"])
    assert list(compose(["trainer.logger.0=jsonl"]).trainer.logger) == ["jsonl"]
    with pytest.raises(ConfigError, match="unknown config key `trainer.loggers.0`"):
        check_overrides(["trainer.loggers.0=jsonl"])  # a typo in the list's own key is still named


def test_hydra_composition_errors_read_as_one_line():
    with pytest.raises(ConfigCompositionException) as err:
        compose(["+data.train_batch_size=4"])
    assert hydra_error_line(err.value) == (
        "+data.train_batch_size=4: data.train_batch_size is already set (by the config or a recipe), and `+` only "
        "adds a key that is not: write data.train_batch_size=4 to change it (or ++data.train_batch_size=4 to set it "
        "either way)")
    with pytest.raises(ConfigCompositionException) as err:
        compose(["trainer.logger.3=jsonl"])
    assert hydra_error_line(err.value) == ("trainer.logger.3=jsonl: trainer.logger has no item 3 (items count from 0): "
                                           "use an index it has, or set the whole list (key=[a,b])")
