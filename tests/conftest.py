"""Shared set-up for every tier: the one launcher of the real entry point (`run_main`), the one tiny
run (`TINY_RUN`), the K&K role data's fixture, and what a failed run shows (`tail`).

Tiers (markers in pyproject.toml): a bare `pytest` runs unit tests only, in-process and fast;
`integration` starts main_ppo.py, Ray or worker processes (make test); `slow` proves learning
(make test-all); `gpu` needs CUDA and skips cleanly without it (make test-gpu). A test that starts
a Python process without one of those markers fails and says so (`guard_unit_tier`).
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from logicrl.config.phases import ARR

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "data" / "kk_role"
ROLE_DATA = [f"data.train_files={ROLE}/train.parquet", f"data.val_files={ROLE}/test.parquet"]
# The tiny run most integration tests start from: 2 steps of 4 prompts x n=2 on the embedded tiny
# model, 4-token responses, one mini-batch per step, the HF engine (vLLM's start-up costs ~7 s a
# rank; tests about vLLM say rollout.name=vllm), metrics in metrics.jsonl and no validation. A test
# adds what it is about after it: later overrides of the same key win.
TINY_RUN = ["data.train_batch_size=4", f"{ARR}.rollout.n=2", f"{ARR}.actor.ppo_mini_batch_size=4",
            "data.max_response_length=4", "trainer.total_training_steps=2", f"{ARR}.rollout.name=hf",
            "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.test_freq=-1"]
# Tiers whose tests may start processes (the unit tier may not: see guard_unit_tier).
PROCESS_TIERS = ("integration", "slow", "gpu")


def pytest_collection_modifyitems(config, items):
    # make test runs on two xdist workers, each taking one module at a time (the scheduler below), in
    # this order: the SLURM modules (minutes of waiting on the daemons), then the other integration
    # modules, most tests first, then the unit modules, which fill in the end. Module order only: a
    # module's tests stay together and in their own order.
    sizes = collections.Counter(item.nodeid.split("::")[0] for item in items)

    def rank(item):
        module = item.nodeid.split("::")[0]
        process = any(item.get_closest_marker(tier) for tier in PROCESS_TIERS)
        return (scope(item.nodeid) != "tests/slurm", not process, -sizes[module] if process else 0, module)

    items.sort(key=rank)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch  # only paid for when a gpu test was selected

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in gpu_items:
            item.add_marker(skip)


def scope(nodeid: str) -> str:
    """The unit of work an xdist worker takes whole: the test's module, or all of tests/slurm (one
    session cluster, one worker)."""
    module = nodeid.split("::")[0]
    return "tests/slurm" if module.startswith("tests/slurm/") else module


@pytest.hookimpl(optionalhook=True)  # an xdist hook: a pytest without xdist must not refuse it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` by scope() above (pytest 9 ignores xdist_group marks: xdist 3.8 renames the
    node ids that pytest 9 no longer reads), so module-scoped runs are made once."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return ByScope(config, log)


@pytest.fixture(autouse=True)
def guard_unit_tier(request, monkeypatch):
    """Keeps the default tier honest: a test without a process tier's marker that starts a Python
    process (main_ppo.py, a Ray node, torch's spawned ranks, vLLM's helpers) fails after it ran,
    naming the marker to add. The process still starts (failing inside a library's start-up could
    hang it); short helper processes (make, nvidia-smi, git) are not counted."""
    if any(request.node.get_closest_marker(tier) for tier in PROCESS_TIERS):
        yield
        return
    import _posixsubprocess

    real, started = _posixsubprocess.fork_exec, []

    def fork_exec(args, executable_list, *rest):
        # args is argv ([b"python", "main_ppo.py", ...]); executable_list the paths tried.
        names = [os.path.basename(os.fsdecode(a)) for a in [*(args or [])[:1], *(executable_list or [])]]
        if any(name.startswith("python") or name == "ray" for name in names):
            started.append(" ".join(map(os.fsdecode, args or []))[:200])
        return real(args, executable_list, *rest)

    # subprocess keeps its own reference; multiprocessing's spawn (torch's mp.spawn) reads the module's.
    monkeypatch.setattr(subprocess, "_fork_exec", fork_exec)
    monkeypatch.setattr(_posixsubprocess, "fork_exec", fork_exec)
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} started {started[0]!r}: a unit test starts no process; mark it "
                    "integration (pytestmark = pytest.mark.integration)", pytrace=False)


@pytest.fixture(autouse=True)
def shared_ray_first(request):
    """SharedRay started before an integration test's body, not inside the first run_main that joins it: a
    refusal timed within seconds (tests/bad_inputs) must not count the head's start."""
    if request.node.get_closest_marker("integration"):
        SharedRay.get()
    yield


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh tiny-model cache directory (tokenizer built from scratch) per test module."""
    return tmp_path_factory.mktemp("logicrl-cache")


@pytest.fixture(scope="module")
def tokenizer(cache):
    from logicrl.models.tiny import load_tiny_tokenizer

    return load_tiny_tokenizer(cache)


def need_data(name: str = "kk_role") -> Path:
    """data/<name>, or the test skips saying how to build it (the Makefile's `data` target)."""
    if not (ROOT / "data" / name / "train.parquet").is_file():
        pytest.skip(f"data/{name} is missing: run `make data`")
    return ROOT / "data" / name


@pytest.fixture(scope="session")
def kk_role() -> list[str]:
    """ROLE_DATA, the overrides that train and validate on data/kk_role; skips where it is not built."""
    need_data("kk_role")
    return ROLE_DATA


@pytest.fixture(scope="session")
def tiny_rm() -> Path:
    """The embedded reward model's checkpoint (embedded:tiny_rm), built once per test run: 83 s of
    training on 2 idle cores the first time, then read from the cache root ($LOGICRL_CACHE or
    ~/.cache/logicrl), where main_ppo.py and its workers find it too."""
    from logicrl.models.loading import checkpoint_dir
    from logicrl.models.tiny import EMBEDDED_TINY_RM

    return checkpoint_dir(EMBEDDED_TINY_RM)


def write_jsonl(path: Path, rows: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"puzzle {i}"}], "data_source": "kk_role",
                                "reward_model": {"style": "rule", "ground_truth": {"name": "Zoey", "role": "knight"}}})
                    + "\n")
    return path


@pytest.fixture
def stage_files(tmp_path) -> dict[str, str]:
    """Three 40-row jsonl sets (a, b, val) for two-stage curricula (tests/config/test_stages.py two_stages)."""
    return {name: str(write_jsonl(tmp_path / f"{name}.jsonl", 40)) for name in ("a", "b", "val")}


# The batch the config tests' hand-computed numbers assume, pinned so that retuning the embedded
# default does not change them: 8 prompts x 4 responses, mini-batches of 4 prompts, micro 4.
BASE_BATCH = ["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"]


@pytest.fixture
def data_files(tmp_path) -> list[str]:
    """Overrides pointing data.train_files/val_files at small jsonl sets (20 train rows, 4 val rows),
    with BASE_BATCH (later overrides of the same keys win)."""
    train = write_jsonl(tmp_path / "data" / "train.jsonl", 20)
    val = write_jsonl(tmp_path / "data" / "test.jsonl", 4)
    return [f"data.train_files={train}", f"data.val_files={val}", *BASE_BATCH]


def _sigint_default() -> None:
    """In the child before exec: SIGINT back to its default. A child inherits an ignored SIGINT (Python then
    installs no KeyboardInterrupt handler), and something earlier in a pytest-xdist worker can leave it ignored:
    in make test the Ctrl-C case of test_signals.py hung there (twice) while the SIGTERM case passed, and it
    passes alone, under CPU load and in module order."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class SharedRay:
    """One Ray head per pytest process, started on first use, that plain runs join (RAY_ADDRESS) instead of
    each starting and stopping a private cluster: about 5 s of wall and 3 CPU s a launch on 2 cores
    (docs/testing.md). Own temp dir and free port, stopped by its pid at exit, never by name."""

    head: subprocess.Popen | None = None
    address: str | None = None
    temp: str | None = None

    @classmethod
    def get(cls) -> str:
        if cls.address is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            # Short: Ray's unix sockets live under it, and their paths may not pass 107 bytes.
            temp = tempfile.mkdtemp(prefix="lr-ray-", dir="/tmp")
            ray = Path(sys.executable).with_name("ray")
            # The raylet's environment is what the ranks get (a private cluster's is the driver's): one
            # thread a rank, as run_main gives the driver.
            env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1",
                   "TOKENIZERS_PARALLELISM": "false"}
            env.pop("LOGICRL_INJECT_FAULT", None)
            # 8 CPUs on 2 cores: room for a 2-rank run while the previous run's actors are still ending.
            cls.head = subprocess.Popen(
                [str(ray), "start", "--head", "--block", "--num-cpus=8", f"--port={port}", f"--temp-dir={temp}",
                 "--include-dashboard=false"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                cwd=ROOT, start_new_session=True, preexec_fn=_end_with_parent)
            cls.temp = temp
            atexit.register(cls.stop)
            cls.address = f"127.0.0.1:{port}"
            cls._wait_for_node()
        return cls.address

    @classmethod
    def _wait_for_node(cls, timeout: float = 120) -> None:
        # The GCS answers before the raylet has registered the node: wait until `ray status` lists its CPUs.
        ray = Path(sys.executable).with_name("ray")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cls.head.poll() is not None:
                break
            status = subprocess.run([str(ray), "status", f"--address={cls.address}"], capture_output=True, text=True,
                                    env={**os.environ, "RAY_AUTH_MODE": "disabled"})
            if status.returncode == 0 and "CPU" in status.stdout:
                return
            time.sleep(1)
        cls.stop()
        raise RuntimeError(f"the tests' shared Ray head did not start in {timeout:.0f} s")

    @classmethod
    def stop(cls) -> None:
        head, cls.head, cls.address = cls.head, None, None
        if head is None or head.poll() is not None:
            return
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
        try:
            head.wait(timeout=10)
        except subprocess.TimeoutExpired:  # its GCS can outlive the raylet by 30 s and more
            os.killpg(head.pid, signal.SIGKILL)  # its own session: only what it started
            head.wait()
        shutil.rmtree(cls.temp, ignore_errors=True)


def _end_with_parent() -> None:
    """In the shared head's `ray start` before exec: SIGTERM when the pytest process that started it dies,
    killed or not, so a cancelled test run leaves no cluster behind (atexit runs only on a normal exit)."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def run_main(*overrides: str, fault: str | None = None, popen: bool = False, cwd: Path | None = None,
             env: dict | None = None, timeout: float = 900, private_ray: bool = False):
    """Run the real entry point as a user would: `python main_ppo.py *overrides`, one-line errors
    (HYDRA_FULL_ERROR=0), Hydra's run dir under `cwd` unless hydra.run.dir is given.

    fault: LOGICRL_INJECT_FAULT for this run only (logicrl/faults.py; Ray's workers inherit it from the
    driver); never inherited from the test's own environment. env: more variables for this run.
    popen: return the running subprocess.Popen (stdout and stderr piped, text) instead of waiting.
    The run is in its own session, so a test can signal its process group, and a SIGKILLed
    controller's Ray processes are reaped by Ray, not by the test.
    A run that is waited for, with no fault, no env, no Ray address and no node count of its own, joins
    the test process's SharedRay; the others, and private_ray=True (a test about the cluster the run
    starts), start their own as a user's run does."""
    if not any(a.startswith("trainer.default_local_dir=") for a in overrides):
        # Checkpoints are on by default and resume_mode=auto: a shared directory would make one
        # test resume from another's run.
        overrides = (*overrides, f"trainer.default_local_dir={tempfile.mkdtemp(prefix='logicrl-ckpt-')}")
    # One thread a rank (controller/placement.py thread_cap): make test runs two tests at once on 2
    # cores, and a tiny model's rank gains nothing from a second thread but its spinning.
    run_env = {**os.environ, "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1", **(env or {})}
    if not (private_ray or popen or fault or env or "RAY_ADDRESS" in os.environ
            or any(a.startswith(("trainer.ray_address=", "trainer.nnodes=")) for a in overrides)):
        run_env.update(RAY_ADDRESS=SharedRay.get(), RAY_AUTH_MODE="disabled")
    run_env.pop("LOGICRL_INJECT_FAULT", None)
    if fault:
        run_env["LOGICRL_INJECT_FAULT"] = fault
    argv = [sys.executable, str(ROOT / "main_ppo.py"), *overrides]
    if popen:  # a run the test signals: Ctrl-C must reach it as it reaches a terminal's foreground job
        return subprocess.Popen(argv, cwd=cwd or ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=run_env, start_new_session=True, preexec_fn=_sigint_default)
    return subprocess.run(argv, cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout, env=run_env,
                          start_new_session=True)


def tail(result, chars: int = 3000) -> str:
    """The end of a finished run's stderr (or of a string): what an assertion shows when a run failed."""
    text = result if isinstance(result, str) else result.stderr or ""
    return text[-chars:]
