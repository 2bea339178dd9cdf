"""An OOM on one rank of two, inside FSDP2's forward, through the real entry point: the run ends
at once (not after the process group's timeout) with exit 4 and one line naming the rank and the
phase, the last checkpoint intact and the halved micro-batch saved; the same command then resumes
from that checkpoint with the halved micro-batch and completes.

`oom@update_actor:2@rank1` raises on rank 1 only, in its first decoder layer's forward of step 2's
update, while rank 0 goes on into the next layer's all-gather (logicrl/faults.py). Before the fix
rank 1's retry agreement met rank 0's all-gather and both waited out the 30-minute timeout.

Slow tier (two 2-rank launches): make test keeps the pieces, tests/workers/test_oom_ranks.py (the failing
rank gives up inside FSDP2's collectives at once, no hang) and tests/trainer/test_micro_sizes.py (the
halved value saved, the line naming rank, node, phase, file and checkpoint, the resumed plan taking it).
"""

import json
import subprocess
import time

import psutil
import pytest

from logicrl.config.phases import ARR
from tests.conftest import ROLE_DATA, TINY_RUN, read_metrics, run_main, tail
from tests.helpers.signals import assert_gone, finish, intact, one_error_line, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("kk_role")]
MICRO = f"{ARR}.actor.ppo_micro_batch_size_per_gpu"
# 4 prompts x 4 responses over 2 ranks: 8 responses per rank and mini-batch, 2 micro-batches of 4.
RUN = [*ROLE_DATA, *TINY_RUN, f"{ARR}.rollout.n=4", f"{MICRO}=4", "trainer.n_gpus=2", "trainer.total_training_steps=3",
       "trainer.save_freq=1"]
BOUND_S = 90  # from step 1's checkpoint (the fault is in step 2) to the exit


def start(tmp_path, fault=None) -> subprocess.Popen:
    return run_main(*RUN, f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"hydra.run.dir={tmp_path / 'run'}",
                    fault=fault, popen=True, cwd=tmp_path)


def test_an_oom_on_one_rank_ends_the_run_at_once_and_the_same_command_resumes_with_half(tmp_path):
    ckpt, run_dir = tmp_path / "ckpt", tmp_path / "run"
    proc = start(tmp_path, fault="oom@update_actor:2@rank1")
    # Or the run ended first (the test then fails below, with its stderr).
    wait_for(lambda: (ckpt / "global_step_1" / "COMPLETE").is_file() or proc.poll() is not None, timeout=600)
    saved_at = time.monotonic()
    ray = psutil.Process(proc.pid).children(recursive=True)
    returncode, _, err, _ = finish(proc, timeout=BOUND_S + 60)
    seconds = time.monotonic() - saved_at
    line = one_error_line(err)
    assert returncode == 4, tail(err)
    assert seconds < BOUND_S, f"{seconds:.0f} s from step 1's checkpoint to the exit"
    assert line.startswith("error: rank 1 on node "), line
    assert f" ran out of memory in update_actor with {MICRO}=4, " in line, line
    assert f"{MICRO}=2 is saved in {ckpt / 'micro_sizes.json'}" in line, line
    assert f"the last checkpoint {ckpt / 'global_step_1'} is intact" in line, line
    assert intact(ckpt) == [1]
    assert json.loads((ckpt / "micro_sizes.json").read_text())["sizes"] == {MICRO: 2}
    assert_gone(ray)  # rank 0, stuck in FSDP2's all-gather, went with the worker group

    again = start(tmp_path)  # the same command, without the fault
    returncode, out, err, _ = finish(again, timeout=600)
    assert returncode == 0, tail(err)
    assert f"{MICRO}=2, not 4: an out-of-memory error ended an earlier run" in out + err
    assert f"resumed from {ckpt / 'global_step_1'} at step 1" in (run_dir / "main_ppo.log").read_text()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]  # step 2 was never logged by the run that ended in it
    assert [r["perf/micro_size/update_actor"] for r in rows] == [4, 2, 2]
    assert [r["perf/oom_retries/update_actor"] for r in rows] == [0, 0, 0]  # taken from the plan, not retried
    assert intact(ckpt) == [1, 2, 3]
