"""Separate rollout and trainer groups in the config (config/async_training.py): verl's keys size the groups,
max_staleness defaults to 1 there, and what two groups cannot run is refused in one line before anything starts."""

import logging

import pytest

from logicrl.config import compose, validate
from logicrl.config.async_training import staleness
from logicrl.config.phases import ARR
from tests.conftest import assert_refused, check_main

SPLIT = [f"{ARR}.hybrid_engine=false"]


def test_verls_one_step_off_keys_size_the_two_groups(data_files, caplog):
    with caplog.at_level(logging.INFO, logger="logicrl.config"):
        cfg, _, plan = validate(compose([*data_files, *SPLIT, "trainer.n_gpus_per_node=2", "rollout.nnodes=2",
                                         "rollout.n_gpus_per_node=2", f"{ARR}.actor.ppo_mini_batch_size=8"]))
    # 8 prompts x n=4: 16 responses a trainer rank trains, 8 a rollout rank generates.
    assert (plan.ranks, plan.rollout_ranks, plan.training_ranks, plan.generating_ranks) == (2, 4, 2, 4)
    assert (plan.per_rank_responses, plan.gen_per_rank_responses) == (16, 8)
    assert cfg.async_training.max_staleness == 1 and staleness(cfg) == 1
    assert "derived: async_training.max_staleness=1" in caplog.text


def test_colocated_runs_are_planned_as_before(data_files):
    cfg, _, plan = validate(compose([*data_files, "rollout.n_gpus_per_node=4"]))  # read only with two groups
    assert (plan.rollout_ranks, plan.generating_ranks, plan.training_ranks) == (0, 1, 1)
    assert cfg.async_training.max_staleness is None and staleness(cfg) == 0
    cfg, _, _ = validate(compose([*data_files, *SPLIT, "async_training.max_staleness=0"]))
    assert staleness(cfg) == 0


@pytest.mark.parametrize("overrides, names", [
    (["async_training.max_staleness=1"], ["async_training.max_staleness=1 needs", f"{ARR}.hybrid_engine=false"]),
    ([*SPLIT, "async_training.max_staleness=2"], ["async_training.max_staleness=2", "set 0 or 1"]),
    ([*SPLIT, "rollout.n_gpus_per_node=3"], ["32 responses do not split across rollout.nnodes x "
                                             "rollout.n_gpus_per_node = 3 rollout ranks"]),
    # The engine's TP groups are cut from the rollout group's ranks (1 here), whatever the trainer group has.
    ([*SPLIT, "trainer.n_gpus_per_node=2", f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.tensor_model_parallel_size=2"],
     [f"{ARR}.rollout.tensor_model_parallel_size=2 must divide rollout.nnodes x rollout.n_gpus_per_node=1"]),
    # Dynamic sampling scores each round before drawing the next: nothing to generate ahead (0 runs it).
    ([*SPLIT, "algorithm.filter_groups.enable=true"],
     ["algorithm.filter_groups.enable=true with async_training.max_staleness=1", "set async_training.max_staleness=0"]),
    ([*SPLIT, "rollout.n_gpus_per_node=4", "async_training.max_staleness=0", "algorithm.filter_groups.enable=true",
      "data.gen_batch_size=1", f"{ARR}.rollout.n=2"],
     ["data.gen_batch_size=1 x", "= 2 responses a round do not split across rollout.nnodes x "
                                 "rollout.n_gpus_per_node=4 ranks"]),
    ([*SPLIT, "algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=reinforce",
      "algorithm.rollout_correction.rollout_is=null"],
     ["loss_type=reinforce with rollout_is=null and async_training.max_staleness=1", "entropy collapses"]),
])
def test_what_two_groups_cannot_run_is_refused_in_one_line(data_files, overrides, names):
    assert_refused(check_main(*data_files, *overrides), *names)


def test_reinforce_without_truncation_is_allowed_when_nothing_is_stale(data_files):
    corr = "algorithm.rollout_correction."
    validate(compose([*data_files, *SPLIT, "async_training.max_staleness=0", f"{corr}bypass_mode=true",
                      f"{corr}loss_type=reinforce", f"{corr}rollout_is=null"]))


def test_stale_samples_without_importance_weights_are_warned_about(data_files, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        validate(compose([*data_files, *SPLIT, "algorithm.rollout_correction.rollout_is=null",
                          "algorithm.rollout_correction.bypass_mode=false"]))
    assert "train without importance weights against the engine that sampled them" in caplog.text


@pytest.mark.parametrize("overrides, bypass", [
    (SPLIT, True),  # staleness 1: the PPO ratio against the engine that sampled, clipped (docs/async.md)
    ([*SPLIT, "async_training.max_staleness=0"], False),  # the colocated run's loss, to the bit
    ([], False),  # colocated
    ([*SPLIT, "algorithm.rollout_correction.bypass_mode=false"], False),  # decoupled, chosen
])
def test_stale_batches_train_in_bypass_mode_unless_told_otherwise(data_files, overrides, bypass, caplog):
    with caplog.at_level(logging.INFO, logger="logicrl.config"):
        cfg, _, plan = validate(compose([*data_files, *overrides]))
    assert cfg.algorithm.rollout_correction.bypass_mode is bypass
    assert ("derived: algorithm.rollout_correction.bypass_mode=true" in caplog.text) is bypass
    # Bypass needs no old-log-prob pass: the engine's log-probs are the old ones.
    assert (plan.phase("old_log_prob").skipped == "rollout_correction.bypass_mode: the engine's log-probs are the "
            "old log-probs") is bypass


# verl's one-step-off script's dry run, both groups' plans and the estimate: tests/config/test_verl_one_step_off.py


def test_both_groups_need_a_gpu_each_on_one_machine(data_files, monkeypatch):
    from logicrl.config.errors import ConfigError
    from logicrl.preflight import device

    monkeypatch.setattr(device, "visible_gpus", lambda: 4)
    cfg, _, plan = validate(compose([*data_files, *SPLIT, "trainer.device=cuda", "trainer.n_gpus_per_node=2",
                                     "rollout.n_gpus_per_node=2"]))
    device.check_device(cfg, plan)  # 2 + 2 on 4
    cfg, _, plan = validate(compose([*data_files, *SPLIT, "trainer.device=cuda", "trainer.n_gpus_per_node=4",
                                     "rollout.n_gpus_per_node=2"]))
    with pytest.raises(ConfigError, match="trainer.n_gpus=4 trainer ranks \\+ rollout.nnodes x "
                                          "rollout.n_gpus_per_node=2 rollout ranks need 6 GPUs, but this machine "
                                          "has 4 visible"):
        device.check_device(cfg, plan)
