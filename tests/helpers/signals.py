"""Running main_ppo.py as a process a test signals, and what it leaves: shared by tests/bad_inputs/test_signals.py,
test_gcs.py, tests/trainer/test_oom_one_rank.py and tests/slurm/test_wrapper.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from logicrl.trainer.checkpoint import complete_checkpoints, damage
from tests.conftest import ROLE_DATA, TINY_RUN, run_main, tail

RUN = [*ROLE_DATA, *TINY_RUN, "trainer.save_freq=1"]


def start(tmp_path: Path, *extra: str, fault: str | None = None) -> subprocess.Popen:
    return run_main(*RUN, *extra, f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                    f"hydra.run.dir={tmp_path / 'run'}", fault=fault, popen=True, cwd=tmp_path)


def wait_for(what, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)


def finish(proc: subprocess.Popen, timeout: float = 120) -> tuple[int, str, str, float]:
    start_s = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the run did not end: a hang")
    return proc.returncode, out, err, time.monotonic() - start_s


def one_error_line(err: str) -> str:
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]), tail(err)
    assert "Traceback" not in err, tail(err)
    return errors[0]


def assert_gone(processes: list[psutil.Process]) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                              for p in processes):
        time.sleep(0.5)
    left = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not left, [" ".join(p.cmdline()[:3]) for p in left]


def intact(ckpt: Path) -> list[int]:
    found = complete_checkpoints(ckpt)
    assert found and all(damage(path) is None for _, path in found)
    assert not [p for p in ckpt.iterdir() if ".tmp-" in p.name]  # a save cut short was dropped
    return [step for step, _ in found]
