"""The micro-batch an OOM halved before it ended a run is kept beside the checkpoints and caps the
plan of the run that resumes (trainer/micro_sizes.py). Plans: 20 prompts, BASE_BATCH (8 prompts x
n=4, mini-batches of 4 prompts, micro 4) on 2 ranks: 4 x 4 / 2 = 8 responses per rank and mini-batch."""

import json

import pytest

from logicrl.config import compose, validate
from logicrl.config.phases import ARR
from logicrl.controller.worker_group import WorkerFailed
from logicrl.trainer.checkpoint import begin, commit
from logicrl.trainer.micro_sizes import SIZES_FILE, apply_saved, ended_by_oom, read_saved, save_halved
from logicrl.workers.oom import RankOutOfMemory
from tests.conftest import BASE_BATCH, write_jsonl

MICRO = f"{ARR}.actor.ppo_micro_batch_size_per_gpu"
LOGPROB = f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu"


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = write_jsonl(tmp_path_factory.mktemp("sizes") / "train.jsonl", 20)
    cfg = compose([f"data.train_files={path}", f"data.val_files={path}", *BASE_BATCH, "trainer.n_gpus=2",
                   f"{MICRO}=8"])
    return validate(cfg)[2]


def micro(plan, phase):
    return plan.micro(phase).value


def test_a_saved_value_only_ever_lowers(tmp_path):
    save_halved(tmp_path, MICRO, 4)
    save_halved(tmp_path, MICRO, 2)
    save_halved(tmp_path, MICRO, 4)  # a larger one later (another phase's OOM) does not raise it
    save_halved(tmp_path, LOGPROB, 4)
    assert read_saved(tmp_path) == {MICRO: 2, LOGPROB: 4}
    assert json.loads((tmp_path / SIZES_FILE).read_text())["format"] == 1


def test_the_plan_takes_the_saved_values(plan, tmp_path, caplog):
    assert (micro(plan, "update_actor"), micro(plan, "old_log_prob"), plan.actor.grad_accum) == (8, 8, 1)
    save_halved(tmp_path, MICRO, 4)
    save_halved(tmp_path, LOGPROB, 16)  # above the config's 8: the config's stays
    save_halved(tmp_path, "critic.ppo_micro_batch_size_per_gpu", 1)  # no critic in this plan: ignored
    resumed = apply_saved(plan, tmp_path)
    assert (micro(resumed, "update_actor"), micro(resumed, "old_log_prob")) == (4, 8)
    assert (resumed.actor.micro.value, resumed.actor.grad_accum) == (4, 2)  # the update splits by it too
    assert f"{MICRO}=4, not 8" in caplog.text and str(tmp_path / SIZES_FILE) in caplog.text


def test_a_saved_training_micro_batch_divides_the_mini_batch(plan, tmp_path):
    save_halved(tmp_path, MICRO, 3)  # 6 // 2, say: 3 does not divide 8 responses; 2 does
    assert micro(apply_saved(plan, tmp_path), "update_actor") == 2


def test_no_file_leaves_the_plan(plan, tmp_path):
    assert apply_saved(plan, tmp_path) is plan


def test_the_ending_line_names_rank_node_phase_file_and_checkpoint(tmp_path):
    commit(begin(tmp_path, 3))
    err = WorkerFailed(1, "update_actor", RankOutOfMemory("update_actor", MICRO, 8, 4), "RankOutOfMemory: ...",
                       node="10.0.0.7")
    line = str(ended_by_oom(tmp_path, err))
    assert line.startswith(f"rank 1 on node 10.0.0.7 ran out of memory in update_actor with {MICRO}=8, ")
    assert f"{MICRO}=4 is saved in {tmp_path / SIZES_FILE}" in line
    assert f"the last checkpoint {tmp_path / 'global_step_3'} is intact" in line
    assert read_saved(tmp_path) == {MICRO: 4}
