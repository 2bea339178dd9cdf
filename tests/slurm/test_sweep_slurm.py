"""A sweep on SLURM: `main_ppo.py -m hydra/launcher=submitit_slurm ...` is one job array, each task
a job of the sweep, with a bad value failing only its own task and the summary listing both."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from logicrl.config.plan import ARR
from tests.conftest import ROOT, tail
from tests.launch.conftest import summary_rows

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
def test_a_submitit_sweep_is_one_array_and_a_bad_value_fails_only_its_task(slurm, tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "main_ppo.py"), "-m", "hydra/launcher=submitit_slurm",
           "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10", "trainer.dry_run=true",
           f"{ARR}.rollout.n=0,4", f"hydra.sweep.dir={sweep}"]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env={**slurm.env, "HYDRA_FULL_ERROR": "0"}, capture_output=True,
                              text=True, timeout=240)
    finally:  # for the fixture's clean-up: the array's tasks, by the ids submitit named its folders
        folders = (sweep / ".submitit").iterdir() if (sweep / ".submitit").is_dir() else []
        tasks = sorted(p.name for p in folders if re.fullmatch(r"\d+_\d+", p.name))  # <array id>_<task>
        slurm.jobs += sorted({t.split("_")[0] for t in tasks})
    assert done.returncode == 1, tail(done)  # one job did not run
    assert "logicrl sweep: 1 of 2 job(s) cannot run as given" in done.stdout
    arrays = {t.split("_")[0] for t in tasks}
    assert len(arrays) == 1 and len(tasks) == 2, tasks  # one array of two tasks
    array = arrays.pop()
    assert slurm.job(f"{array}_1").get("ArrayJobId") == array
    rows = summary_rows(sweep)
    assert "| failed |" in rows["rollout.n=0"] and "must be >= 1" in rows["rollout.n=0"]
    assert "| done (planned) |" in rows["rollout.n=4"]
    # Both tasks ran to their end in SLURM: the bad one failed as a job of the sweep, not as a task. submitit
    # returns once each task wrote its result; the task's end (its epilog) reaches slurmctld a moment later.
    assert {slurm.wait(t, timeout=30) for t in tasks} == {"COMPLETED"}
