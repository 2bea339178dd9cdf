"""ulysses_sequence_parallel_size (config/sequence_parallel.py): accepted where the ranks, heads and packing
allow it, refused in one line naming the key and the fix before anything starts."""

import json
import logging

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR
from tests.conftest import ROOT

SP = f"{ARR}.actor.ulysses_sequence_parallel_size"
QWEN7B = ROOT / "logicrl/memory/shapes/qwen2.5-7b"  # 28 heads, 4 KV heads
PACKED = f"{ARR}.model.use_remove_padding=true"


def refusal(overrides) -> str:
    with pytest.raises(ConfigError) as err:
        validate(compose(overrides))
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_sp2_on_the_tiny_model_is_accepted_and_follows_into_ref_critic_and_reward_model(data_files, caplog):
    with caplog.at_level(logging.INFO, logger="logicrl.config"):
        cfg, _, _ = validate(compose([*data_files, PACKED, "trainer.n_gpus=2", f"{SP}=2", "algorithm.adv_estimator=gae",
                                      f"{ARR}.actor.use_kl_loss=true"]))
    assert cfg[ARR].ref.ulysses_sequence_parallel_size == 2
    assert cfg.critic.ulysses_sequence_parallel_size == cfg.reward_model.ulysses_sequence_parallel_size == 2
    # The tiny model has 1 KV head: each is replicated twice, and the log says so.
    assert any("each is replicated 2 times" in r.getMessage() for r in caplog.records)


def test_a_size_that_does_not_divide_the_ranks_is_refused(data_files):
    message = refusal([*data_files, PACKED, "trainer.n_gpus=4", f"{SP}=3"])
    assert message.startswith(f"{SP}=3 must divide trainer.n_gpus=4"), message


def test_sp_without_packing_is_refused(data_files):
    message = refusal([*data_files, "trainer.n_gpus=2", f"{SP}=2", f"{ARR}.model.use_remove_padding=false"])
    assert message == f"{SP}=2 splits packed rows across ranks: set {ARR}.model.use_remove_padding=true"


def test_the_critic_without_packing_is_refused_naming_its_own_key(data_files):
    message = refusal([*data_files, PACKED, "trainer.n_gpus=2", f"{SP}=2", "algorithm.adv_estimator=gae",
                       "critic.model.use_remove_padding=false"])
    assert message.endswith("set critic.model.use_remove_padding=true"), message


def test_a_size_that_does_not_divide_the_heads_is_refused(data_files):
    message = refusal([*data_files, PACKED, f"{ARR}.model.path={QWEN7B}", "trainer.n_gpus=8", f"{SP}=8"])
    assert message.startswith(f"{SP}=8 must divide the model's num_attention_heads=28"), message


def test_kv_heads_neither_divisible_nor_dividing_are_refused(data_files, tmp_path):
    config = json.loads((QWEN7B / "config.json").read_text())
    config.update(num_attention_heads=12, num_key_value_heads=3, hidden_size=12 * 128)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    message = refusal([*data_files, PACKED, f"{ARR}.model.path={tmp_path / 'm'}", "trainer.n_gpus=2", f"{SP}=2",
                       f"{ARR}.rollout.name=hf"])
    assert message.startswith(f"{SP}=2 must divide the model's num_key_value_heads=3 or be a multiple of it"), message


def test_different_sizes_for_models_in_use_are_refused(data_files):
    message = refusal([*data_files, PACKED, "trainer.n_gpus=2", f"{SP}=2", "algorithm.adv_estimator=gae",
                       "critic.ulysses_sequence_parallel_size=1"])
    assert message == (f"{SP}=2, critic.ulysses_sequence_parallel_size=1: every model in use needs the same "
                       "sequence-parallel size (each rank holds one share of the step's rows for all of them): "
                       "set them equal")


def test_a_model_not_in_use_keeps_any_size(data_files):
    # GRPO builds no critic: its key is not checked.
    validate(compose([*data_files, PACKED, "trainer.n_gpus=2", f"{SP}=2", "critic.ulysses_sequence_parallel_size=1"]))
