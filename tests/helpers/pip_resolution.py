"""pip's resolution of the CUDA install (tests/install/test_gpu_resolution.py), startable ahead of its test.

The resolution is a minute or more of waiting on the package registry (pip reads the metadata of some 250
packages one after another) and little CPU. Under make test's two xdist workers, the worker that ran it sat
idle that long; so the xdist controller, which only waits, starts it in a thread of its own when the
session begins (`start_early`, from tests/conftest.py), and the test's worker reads the outcome
(`outcome`), waiting only for what is left. Without xdist the test resolves in its own process, as before.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests/install/test_gpu_resolution.py"
# What a CUDA box's pip keeps from the environment: how to reach the registry, nothing that changes
# what resolves (this machine's find-links, local indexes and constraints hold CPU builds of torch).
KEEP = {"PIP_INDEX_URL", "PIP_CERT", "PIP_CLIENT_CERT", "PIP_TRUSTED_HOST", "PIP_PROXY"}
OUTCOME = "outcome.json"


def makefile_gpu_install() -> tuple[list[str], str]:
    """(the Makefile's GPU_PIP flags, the extras it installs beside $(EXTRA)): read, not copied, so
    the test resolves what `make` installs."""
    text = (ROOT / "Makefile").read_text()
    flags = re.search(r"^GPU_PIP := (.+)$", text, re.M).group(1).split()
    # Up to the CPU-only extras the Makefile appends with $(if ...): the CUDA install does not get them.
    extras = re.search(r"-e '\.\[\$\(EXTRA\),([^\]$]*)", text).group(1)
    return flags, extras


def pip(*args: str, cwd: Path, timeout: float, running: list | None = None) -> dict:
    """pip as a CUDA box runs it: {"returncode", "stderr"}. `running` gets the process while it runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in KEEP}
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf either: a CUDA box's pip, not this machine's
    proc = subprocess.Popen([sys.executable, "-m", "pip", *args, "--retries", "1", "--timeout", "30"], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if running is not None:
        running.append(proc)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        err += f"\n(pip ran past {timeout:.0f} s and was stopped)"
    return {"returncode": proc.returncode, "stderr": err}


def resolve(tmp: Path, running: list | None = None) -> dict:
    """`make`'s CUDA install resolved with --dry-run into tmp/report.json: {"step", "returncode", "stderr",
    "report"}, step "index" when the registry's one-request probe failed (offline: fails fast)."""
    probe = pip("index", "versions", "vllm", cwd=tmp, timeout=120, running=running)
    if probe["returncode"] != 0:
        return {"step": "index", **probe, "report": None}
    flags, extras = makefile_gpu_install()
    # The project's metadata is all pip reads of it: a copy keeps setuptools' egg-info out of the checkout.
    project = tmp / "logicrl"
    project.mkdir(exist_ok=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    report = tmp / "report.json"
    # fast-deps reads a wheel's metadata with HTTP range requests where the index serves no separate
    # metadata file; without it pip downloads every wheel it considers (4.7 GB here: torch twice, CUDA libraries).
    result = pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                 "--use-feature=fast-deps", *flags, "-e", f".[gpu,{extras}]", cwd=project, timeout=900,
                 running=running)
    return {"step": "install", **result, "report": str(report)}


class Early:
    """The resolution running in a thread of the xdist controller; its outcome lands in `directory`."""

    def __init__(self):
        self.directory = Path(tempfile.mkdtemp(prefix="logicrl-pip-resolution-"))
        self.running: list[subprocess.Popen] = []
        self.thread = threading.Thread(target=self._run, name="logicrl-pip-resolution", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        outcome = resolve(self.directory, self.running)
        written = self.directory / (OUTCOME + ".part")
        written.write_text(json.dumps(outcome))
        written.rename(self.directory / OUTCOME)  # whole or absent: the worker never reads half of it

    def stop(self) -> None:
        for proc in self.running:
            if proc.poll() is None:
                proc.kill()
        self.thread.join(timeout=30)
        shutil.rmtree(self.directory, ignore_errors=True)


_early: Early | None = None


def start_early(config) -> str | None:
    """In the xdist controller: start the resolution once, if this session may run the test (an -m that keeps
    integration tests, and the module among the paths given); its directory, for the workers."""
    global _early
    markexpr = config.getoption("markexpr") or ""
    wanted = any((ROOT / MODULE).is_relative_to(Path(arg.split("::")[0]).resolve()) for arg in config.args)
    if "not integration" in markexpr or not wanted:
        return None
    if _early is None:
        _early = Early()
    return str(_early.directory)


def stop_early() -> None:
    if _early is not None:
        _early.stop()


def outcome(directory: str | None, tmp: Path, timeout: float = 1200) -> dict:
    """The resolution's outcome: the controller's, once it has written it (`directory`), else made here."""
    if directory is None:
        return resolve(tmp)
    path, deadline = Path(directory) / OUTCOME, time.monotonic() + timeout
    while not path.is_file():
        assert time.monotonic() < deadline, f"the early pip resolution wrote no {path} in {timeout:.0f} s"
        time.sleep(1)
    return json.loads(path.read_text())
