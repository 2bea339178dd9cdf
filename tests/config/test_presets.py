"""The embedded default's values serve the embedded model; a command line that names a checkpoint gets
verl's defaults (preset=verl, added by cli.for_hydra unless a preset is named)."""

import pytest

from logicrl.config import ConfigError, check_overrides, compose
from logicrl.config.cli import for_hydra
from logicrl.config.phases import ARR

SHAPE = "logicrl/memory/shapes/qwen2.5-7b"


def test_a_checkpoint_selects_verls_defaults_beside_its_path():
    assert for_hydra([f"{ARR}.model.path={SHAPE}", "--cfg", "job", "--resolve"]) == [
        f"{ARR}.model.path={SHAPE}", "preset=verl", "--cfg", "job", "--resolve"]
    assert for_hydra([f"{ARR}.model.path=embedded:tiny", "data.train_batch_size=4"]) == [
        f"{ARR}.model.path=embedded:tiny", "data.train_batch_size=4"]
    assert for_hydra(["data.train_batch_size=4"]) == ["data.train_batch_size=4"]
    # A preset the command line names wins, wherever it stands.
    named = ["preset=embedded", f"{ARR}.model.path={SHAPE}"]
    assert for_hydra(named) == named
    assert for_hydra(["-m", f"{ARR}.model.path=/a,/b"]) == ["-m", f"{ARR}.model.path=/a,/b", "preset=verl"]


def test_a_sweep_over_the_embedded_model_and_a_checkpoint_must_name_its_preset():
    with pytest.raises(ConfigError, match="name preset=verl or preset=embedded"):
        for_hydra(["-m", f"{ARR}.model.path=embedded:tiny,{SHAPE}"])
    assert for_hydra(["-m", f"{ARR}.model.path=embedded:tiny,{SHAPE}", "preset=verl"])[-1] == "preset=verl"


def test_the_two_presets_compose_the_values_each_names():
    embedded, verl = compose([]), compose([f"{ARR}.model.path={SHAPE}"])
    assert verl[ARR].model.path == SHAPE
    # verl's ppo_trainer.yaml values, and the embedded default's (conf/preset/embedded.yaml).
    for key, verls, embeddeds in [("algorithm.adv_estimator", "gae", "grpo"), ("data.train_batch_size", 1024, 16),
                                  ("data.max_response_length", 512, 4), (f"{ARR}.rollout.n", 1, 8),
                                  (f"{ARR}.actor.optim.lr", 1e-6, 5e-4), (f"{ARR}.actor.entropy_coeff", 0.0, 0.01),
                                  (f"{ARR}.model.enable_gradient_checkpointing", True, False),
                                  ("trainer.total_epochs", 30, 1)]:
        assert (select(verl, key), select(embedded, key)) == (verls, embeddeds), key
    # Either preset can be named for either model; the command line still wins over it.
    assert compose(["preset=verl"]).algorithm.adv_estimator == "gae"
    cfg = compose([f"{ARR}.model.path={SHAPE}", "preset=embedded", "data.train_batch_size=8"])
    assert (cfg.data.train_batch_size, cfg.algorithm.adv_estimator) == (8, "grpo")
    assert compose([f"{ARR}.model.path={SHAPE}", "algorithm.adv_estimator=rloo"]).algorithm.adv_estimator == "rloo"


def test_a_recipe_goes_over_the_preset():
    cfg = compose(["+recipe=stage1", f"{ARR}.model.path={SHAPE}"])
    assert (cfg.algorithm.adv_estimator, cfg.data.train_batch_size, cfg.trainer.total_epochs) == (
        "reinforce_plus_plus", 8, 1)


def test_an_unknown_preset_is_one_line_naming_the_ones_there_are():
    with pytest.raises(ConfigError, match=r"^preset=big: there is no conf/preset/big.yaml \(available: embedded, ve"):
        check_overrides(["preset=big"])


def select(cfg, key):
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key)
