"""slurm/train.sbatch on a real SLURM with two nodes (tests/slurm/conftest.py): the shape the driver
is given, two jobs on the same nodes at once, training across both nodes, preemption and requeue,
and nothing left behind. Few jobs, each checked for several things: a job pays ~10-20 s for Ray.
Training and preemption (two 24-step jobs, one requeued: two minutes) are in the slow tier; make test
keeps the two dry-run jobs (docs/testing.md says what else covers the rest)."""

from __future__ import annotations

import ast
import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, tail
from tests.helpers.signals import RUN
from tests.slurm.conftest import NODES, job_processes, output_of

pytestmark = pytest.mark.integration
WRAPPER = ROOT / "slurm" / "train.sbatch"
DATA = [f"data.train_files={ROOT}/data/kk_role/train.parquet", f"data.val_files={ROOT}/data/kk_role/test.parquet"]
# 1 rank per node (ppo_mini_batch_size=4 of RUN splits over 2). A step takes ~0.3 s here, so the
# run is long enough for a signal sent after step 1 to land mid-run; it saves only when asked to stop
# (and at the end), so the checkpoint it resumes from is the stop request's.
STEPS = 24
TRAIN = [*RUN, f"trainer.total_training_steps={STEPS}", "trainer.save_freq=100"]


def submit(slurm, submit_dir: Path, *args: str, fault: str = "") -> str:
    """sbatch the wrapper from `submit_dir` (the run's outputs and checkpoints go there), running
    this checkout's logicrl, with LOGICRL_INJECT_FAULT=`fault`."""
    return slurm.sbatch(*args, cwd=submit_dir, env={"LOGICRL_PYTHON": str(ROOT / ".venv" / "bin" / "python"),
                                                    "PYTHONPATH": str(ROOT), "LOGICRL_INJECT_FAULT": fault})


def assert_left_nothing(slurm, submit_dir: Path, job: str) -> None:
    """No process of the job, no Ray dir on any node, no shared job dir."""
    assert job_processes(slurm, job) == []
    assert [p.name for p in slurm.base.glob(f"ray-{job}-*")] == []
    assert not (submit_dir / f".ray-{job}").exists()


def ray_line(out: str) -> tuple[str, list[str]]:
    """The address of the job's Ray and the nodes its driver saw."""
    match = re.search(r"logicrl.launch.slurm: Ray at (\S+), \d+ nodes: (.*)", out)
    assert match, tail(out)
    return match.group(1), match.group(2).split()


@pytest.mark.timeout(240)
def test_two_jobs_at_once_each_with_its_own_ray_and_shape(slurm, tmp_path):
    """Two dry runs on the same two nodes at once, GPUs asked for in both of SLURM's ways: each gets
    its own Ray across both nodes, and its driver is told 2 nodes of 2 ranks."""
    jobs = {how: submit(slurm, tmp_path, "--cpus-per-task=1", how, str(WRAPPER), *DATA, "trainer.dry_run=true")
            for how in ("--gpus-per-node=2", "--gres=gpu:2")}
    heads = set()
    for how, job in jobs.items():
        state = slurm.wait(job, timeout=180)
        out = output_of(tmp_path / f"slurm-{job}.out")
        assert state == "COMPLETED", tail(out)
        # A job that did what it was asked ends without a line a user reads as a failure (srun's own included).
        assert not [line for line in out.splitlines() if "error:" in line.lower()], tail(out)
        address, ips = ray_line(out)
        assert ips == sorted(NODES.values()), f"{how}: the driver saw {ips}"
        heads.add(address)
        assert f"ray_address: {address}" in out  # the driver was pointed at its own job's Ray
        assert re.search(r"ranks\s+4 \(2 node\(s\) x 2\)", out), f"{how}: {tail(out)}"
        assert (tmp_path / "outputs" / "logicrl" / "kk_tiny" / f"slurm-{job}").is_dir()
        assert_left_nothing(slurm, tmp_path, job)
        # The sacct stand-in (tests/slurm/bin/sacct) answers as submitit's poll expects.
        assert slurm.run("sacct", "-o", "JobID,State,NodeList", "--parsable2", "-j", job).splitlines() == \
            ["JobID|State|NodeList", f"{job}|COMPLETED|n[1-2]"]
    assert len(heads) == 2, f"both jobs used one Ray: {heads}"


def test_nothing_calls_ray_stop():
    """`ray stop` stops every Ray of the user on a node, other jobs' too: the wrapper stops its own
    by process. Comments and docstrings may name it; no code may run it."""
    calls = []
    for path in [*(ROOT / "slurm").rglob("*"), *(ROOT / "logicrl" / "launch").rglob("*.py")]:
        if path.suffix == ".py":
            tree = ast.parse(path.read_text())
            docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                          if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(node)}
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    if re.search(r"\bray\s+stop\b", node.value) or node.value == "stop":
                        calls.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
        elif path.is_file():
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if re.search(r"\bray\s+stop\b", code):
                    calls.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert calls == []


def test_run_with_bash_outside_slurm_says_use_sbatch_in_one_line(tmp_path):
    """`bash slurm/train.sbatch` (no SLURM job around it) stops before anything starts, saying how to
    run it, not on `set -u`'s "SLURM_SUBMIT_DIR: unbound variable"."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    start = time.monotonic()
    result = subprocess.run(["bash", str(WRAPPER), "+recipe=stage1"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=30)
    seconds = time.monotonic() - start
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, tail(result)
    assert len(lines) == 1 and lines[0].startswith("error: ") and "run it with sbatch" in lines[0], lines
    assert result.stdout == "" and list(tmp_path.iterdir()) == []  # nothing ran, nothing written
    assert seconds < 5, seconds


REQUEUE_SETTLE_S = 5


def steps(metrics: Path) -> list[dict]:
    return [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []


def rank_nodes(slurm, job: str) -> set[str]:
    """The nodes on which the job's ranks (Ray actors titled ray::HybridWorker...) run now."""
    import psutil

    nodes = set()
    for proc in psutil.process_iter():
        try:
            title, env = proc.cmdline(), proc.environ()
        except (psutil.Error, OSError):
            continue
        if title and title[0].startswith("ray::HybridWorker") and env.get("SLURM_JOB_ID") == job \
                and env.get("SLURM_CONF") == slurm.env["SLURM_CONF"]:
            nodes.add(env["SLURMD_NODENAME"])
    return nodes


@pytest.fixture(scope="module")
def two_runs(slurm, tmp_path_factory):
    """The same run twice, at once: one left alone, one preempted once its step 1 is logged
    (USR1 to the batch shell, as --signal=B:USR1 sends it), then released from the ~120 s hold a
    requeued job gets; the requeued run's head finds its first choice of a port taken (the
    `taken` fault: its node step holds the port itself). Returns each one's submit dir, job id and
    what was seen on the way."""
    plain_dir, preempted_dir = tmp_path_factory.mktemp("plain"), tmp_path_factory.mktemp("preempted")
    plain = submit(slurm, plain_dir, "--cpus-per-task=1", str(WRAPPER), *TRAIN)
    preempted = submit(slurm, preempted_dir, "--cpus-per-task=1", str(WRAPPER), *TRAIN, fault="taken@ray_start:1")
    metrics = preempted_dir / "outputs" / "logicrl" / "kk_tiny" / f"slurm-{preempted}" / "metrics.jsonl"
    seen = {"rank_nodes": set(), "started_s": time.monotonic()}
    deadline = time.monotonic() + 240
    while not steps(metrics):
        assert slurm.state(preempted) in ("PENDING", "RUNNING"), output_of(preempted_dir / f"slurm-{preempted}.out")
        assert time.monotonic() < deadline, "no step logged"
        seen["rank_nodes"] |= rank_nodes(slurm, plain)
        time.sleep(0.5)
    seen["step1_s"] = time.monotonic() - seen["started_s"]
    slurm.run("scancel", "--signal=USR1", "--batch", preempted)
    # Requeued: pending again, and (SLURM may show PENDING before the first run has ended) none of
    # the first run's processes left; released earlier, the second run can fail to launch.
    signalled = time.monotonic()
    while slurm.job(preempted).get("Restarts", "0") == "0" or slurm.state(preempted) != "PENDING" \
            or job_processes(slurm, preempted):
        seen["rank_nodes"] |= rank_nodes(slurm, plain)
        assert slurm.state(preempted) in ("RUNNING", "COMPLETING", "REQUEUED", "PENDING"), \
            output_of(preempted_dir / f"slurm-{preempted}.out")
        assert time.monotonic() < signalled + 120, f"not requeued, or left {job_processes(slurm, preempted)}"
        time.sleep(0.5)
    seen["requeued_s"] = time.monotonic() - signalled
    seen["requeued_after_steps"] = [row["step"] for row in steps(metrics)]
    # slurmd ends the first run's batch step a moment after its processes are gone; a launch that
    # arrives before then is refused ("Job N already killed, do not launch batch job") and the job
    # FAILS. SLURM's own ~120 s hold exists for this; a few seconds are enough on one host.
    time.sleep(REQUEUE_SETTLE_S)
    slurm.release(preempted)
    for job in (plain, preempted):
        seen[job] = slurm.wait(job, timeout=300)
    seen["total_s"] = time.monotonic() - seen["started_s"]
    return {"plain": (plain_dir, plain), "preempted": (preempted_dir, preempted), "seen": seen}


def run_metrics(submit_dir: Path, job: str) -> list[dict]:
    return steps(submit_dir / "outputs" / "logicrl" / "kk_tiny" / f"slurm-{job}" / "metrics.jsonl")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trains_across_two_nodes(slurm, two_runs):
    submit_dir, job = two_runs["plain"]
    out = output_of(submit_dir / f"slurm-{job}.out")
    assert two_runs["seen"][job] == "COMPLETED", tail(out)
    assert two_runs["seen"]["rank_nodes"] == set(NODES), "FSDP's two ranks were not one on each node"
    assert [row["step"] for row in run_metrics(submit_dir, job)] == list(range(1, STEPS + 1))
    assert_left_nothing(slurm, submit_dir, job)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_preempted_job_checkpoints_requeues_and_resumes_where_it_stopped(slurm, two_runs):
    submit_dir, job = two_runs["preempted"]
    out = output_of(submit_dir / f"slurm-{job}.out")  # --open-mode=append: both runs of the job
    seen = two_runs["seen"]
    assert seen[job] == "COMPLETED", tail(out)
    assert "stopped at a checkpoint: requeued" in out and f"job {job} (restart 1)" in out, tail(out)
    # The requeued run's first `ray start` lost a port to another holder, and started again on others.
    retried = [line for line in out.splitlines() if "was taken before Ray bound it" in line]
    assert len(retried) == 1 and "starting Ray again on other ports" in retried[0], tail(out)
    assert out.index(f"job {job} (restart 1)") < out.index(retried[0])
    assert seen["requeued_s"] < 60  # a step, a checkpoint, Ray stopped, requeued
    stopped_at = seen["requeued_after_steps"]
    assert stopped_at and stopped_at[-1] < STEPS, f"the job finished before the signal: {stopped_at}"
    # The stop request's checkpoint (save_freq is not due) and the end's.
    saved = sorted(p.name for p in (submit_dir / "checkpoints" / "logicrl" / "kk_tiny").glob("global_step_*"))
    assert saved == sorted([f"global_step_{stopped_at[-1]}", f"global_step_{STEPS}"])
    # One directory and one metrics.jsonl for both runs: each step once, and the rewards of an
    # uninterrupted run (the resumed run picked up its data order and RNG from the checkpoint).
    resumed = run_metrics(submit_dir, job)
    assert [row["step"] for row in resumed] == list(range(1, STEPS + 1))
    plain = run_metrics(*two_runs["plain"])
    rewards = [key for key in plain[0] if key.startswith(("critic/score/", "critic/rewards/", "reward/"))]
    assert "critic/score/mean" in rewards
    assert [{k: row[k] for k in rewards} for row in resumed] == [{k: row[k] for k in rewards} for row in plain]
    assert_left_nothing(slurm, submit_dir, job)
