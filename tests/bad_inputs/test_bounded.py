"""Nothing waits forever: a rank stopped with kill -STOP (the only rank, so no collective times out) ends the
run in the configured bound with one line; a reward that sleeps for an hour is ended and the step goes on;
dynamic sampling with a constant reward and max_num_gen_batches=0 ends each step in bounded rounds; a
reward's bad value is one line naming the function and the response. Two launches."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import read_metrics, tail
from tests.helpers.signals import assert_gone, finish, one_error_line, start, wait_for

pytestmark = pytest.mark.integration

BOUND_S = 10  # trainer.collective_timeout_s for the stopped rank: the heartbeat's bound too


def _idle(rank: psutil.Process, seconds: float = 2.0) -> bool:
    """No more CPU than its heartbeat thread's over `seconds` (generation and updates take a core)."""
    before = sum(rank.cpu_times()[:2])
    time.sleep(seconds)
    return sum(rank.cpu_times()[:2]) - before < 0.1


def test_a_stopped_only_rank_ends_the_run_in_the_bound_with_one_line(tmp_path):
    # Step 2's update_actor sleeps (faults.py stall): the rank is alive, in a step, when it is stopped.
    proc = start(tmp_path, "trainer.total_training_steps=3", f"trainer.collective_timeout_s={BOUND_S}",
                 fault="stall@update_actor:2")
    metrics = tmp_path / "run" / "metrics.jsonl"
    wait_for(lambda: metrics.is_file() and metrics.read_text().count("\n") >= 1)
    ours = psutil.Process(proc.pid).children(recursive=True)
    ranks = [p for p in ours if p.cmdline() and p.cmdline()[0].startswith("ray::HybridWorker")]
    assert len(ranks) == 1, [p.cmdline()[:1] for p in ours]
    # Stopped once in the stall, not in step 2's generate: a rank that spends no CPU for 2 s is in the sleep.
    wait_for(lambda: _idle(ranks[0]))
    ranks[0].send_signal(signal.SIGSTOP)
    returncode, _, err, seconds = finish(proc)
    line = one_error_line(err)
    assert returncode == 1, tail(err)
    assert line.startswith("error: rank 0 on node ") and "died in update_actor: it sent no heartbeat for" in line, line
    assert f"trainer.collective_timeout_s={BOUND_S}" in line, line
    # The bound, the heartbeat's period, the slice of the driver's wait, then Ray's shutdown: well under a minute.
    assert seconds < BOUND_S + 45, seconds
    assert_gone(ours)  # the stopped rank too (SIGKILL reaches a stopped process)


REWARD = '''
import os, time

MARKER = {marker!r}
CALLS = {calls!r}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(CALLS, "a") as f:
        f.write(".")
    try:  # the first call sleeps for an hour (O_EXCL: exactly one, whichever worker gets there first)
        os.close(os.open(MARKER, os.O_CREAT | os.O_EXCL))
        time.sleep(3600)
    except FileExistsError:
        pass
    if os.path.getsize(CALLS) > {nan_after}:  # step 2: a NaN
        return float("nan")
    return 1.0  # constant: no group ever has a spread
'''


def test_a_hung_reward_is_ended_a_constant_one_ends_each_step_and_a_nan_is_one_line(tmp_path):
    # Step 1: round 1's first call is killed after 2 s and scores -3, so its group (-3, 1) has a spread and is
    # kept; rounds 2 and 3 keep none (max_empty_rounds=2): 3 rounds of 4 prompts x n=2 = 24 calls, 1 of the 4
    # groups a step needs, less than a mini-batch: no update. Step 2's first call returns NaN.
    reward = tmp_path / "my_reward.py"
    reward.write_text(REWARD.format(marker=str(tmp_path / "slept"), calls=str(tmp_path / "calls"), nan_after=24))
    start_s = time.monotonic()
    proc = start(tmp_path, f"reward.custom.path={reward}", "reward.timeout_s=2", "reward.timeout_score=-3",
                 "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=0",
                 "algorithm.filter_groups.max_empty_rounds=2", "trainer.total_training_steps=3")
    returncode, out, err, _ = finish(proc, timeout=300)
    seconds = time.monotonic() - start_s
    line = one_error_line(err)
    assert returncode == 2, tail(err)
    assert line.startswith(f"error: custom reward compute_score in {reward} returned a non-finite score nan, on "
                           "response "), line
    assert "of the batch (data_source='kk_role'" in line, line
    assert seconds < 240, seconds  # not the hour
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1], rows
    step1 = rows[0]
    assert step1["reward/timeouts"] == 1.0  # summed over the step's rounds
    assert (step1["filter/gen_rounds"], step1["filter/short"], step1["filter/groups_kept"]) == (3.0, 1.0, 1.0)
    # The timed-out response scored -3, the 23 others 1.0: the mean over the step's 24 responses.
    assert step1["critic/score/mean"] == pytest.approx((23 * 1.0 - 3.0) / 24)
    log = (tmp_path / "run").glob("*.log")
    said = out + err + "".join(Path(p).read_text() for p in log)
    assert "the last 2 keeping no group (algorithm.filter_groups.max_empty_rounds=2" in said, tail(said)


def test_a_full_disk_under_the_run_directory_is_one_line_naming_the_intact_checkpoint(tmp_path):
    # metrics.jsonl on /dev/full: every write to it fails with ENOSPC, as on a full disk. Step 1 is saved, then its
    # metrics row cannot be written.
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to("/dev/full")
    proc = start(tmp_path, "trainer.total_training_steps=2")
    returncode, _, err, _ = finish(proc, timeout=300)
    assert returncode == 1, tail(err)
    assert one_error_line(err) == (
        f"error: cannot write {run / 'metrics.jsonl'} (No space left on device): the disk is full: free space there; "
        f"{tmp_path / 'ckpt' / 'global_step_1'} is intact: run the same command to resume from it"), tail(err)
