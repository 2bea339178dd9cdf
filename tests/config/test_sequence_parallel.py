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


def test_models_may_differ_but_a_lora_reference_is_the_actor(data_files):
    validate(compose([*data_files, PACKED, "trainer.n_gpus=2", f"{SP}=2", "algorithm.adv_estimator=gae",
                      "critic.ulysses_sequence_parallel_size=1", f"{ARR}.actor.use_kl_loss=true",
                      f"{ARR}.ref.ulysses_sequence_parallel_size=1"]))
    message = refusal([*data_files, PACKED, "trainer.n_gpus=2", f"{SP}=2", f"{ARR}.actor.use_kl_loss=true",
                       f"{ARR}.ref.ulysses_sequence_parallel_size=1", f"{ARR}.model.lora_rank=8"])
    assert message == (f"{ARR}.ref.ulysses_sequence_parallel_size=1 differs from {SP}=2, but with LoRA the reference "
                       "is the actor with its adapter off (one model): set them equal")


def test_a_model_not_in_use_keeps_any_size(data_files):
    # GRPO builds no critic: its key is not checked.
    validate(compose([*data_files, PACKED, "trainer.n_gpus=2", f"{SP}=2", "critic.ulysses_sequence_parallel_size=3"]))


def test_phases_go_to_groups_of_their_models_size(data_files):
    from logicrl.config.sequence_parallel import phase_sp_size

    cfg, _, _ = validate(compose([*data_files, PACKED, "trainer.n_gpus=2", f"{SP}=2", "algorithm.adv_estimator=gae",
                                  "critic.ulysses_sequence_parallel_size=1"]))
    sizes = {p: phase_sp_size(cfg, p) for p in ("generate", "old_log_prob", "update_actor", "values", "update_critic")}
    assert sizes == {"generate": 1, "old_log_prob": 2, "update_actor": 2, "values": 1, "update_critic": 1}


def test_with_sp_no_rank_holds_more_than_its_groups_share_and_rollout_stays_per_rank():
    import torch
    from tensordict import TensorDict

    from logicrl.trainer.batch import group_shards

    batch = TensorDict({"input_ids": torch.arange(16)[:, None]}, batch_size=[16])
    generate = group_shards(batch, 4, 1)  # rollout: every rank its own 16 / 4 rows
    assert [p["input_ids"].flatten().tolist() for p in generate] == [list(range(i, i + 4)) for i in (0, 4, 8, 12)]
    train = group_shards(batch, 4, 2)  # SP 2: ranks 0-1 and 2-3 each hold one of 16 / (4 / 2) = 8-row shards
    assert [p["input_ids"].flatten().tolist() for p in train] == [list(range(8))] * 2 + [list(range(8, 16))] * 2
