"""The CUDA install resolves from wheels only, to the pinned vLLM and torch.

pip resolves `-e '.[gpu,test,slurm,quant]'` with the Makefile's wheels-only flags, as `make` does on a CUDA
box, but with --dry-run --ignore-installed: nothing is installed, and this machine's Python (3.11,
x86_64 Linux, like the box's) stands in for the box's. This is the one test that reads the package
registry: it skips, with pip's own words, when the registry cannot be reached. It takes 70-115 s on
this 2-core machine under load (pip reads the metadata of 248 packages, one after another).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, tail

pytestmark = pytest.mark.integration

PINNED = {"vllm": "0.32.0", "torch": "2.13.0"}
# pip's words for a registry it cannot reach (urllib3 and pip's own), as opposed to a failed resolution.
UNREACHABLE = re.compile(r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
                         r"Name or service not known|ProxyError|ConnectTimeout|ReadTimeout|Network is unreachable|"
                         r"Connection refused|SSLError|Could not fetch URL")
# What a CUDA box's pip keeps from the environment: how to reach the registry, nothing that changes
# what resolves (this machine's find-links, local indexes and constraints hold CPU builds of torch).
KEEP = {"PIP_INDEX_URL", "PIP_CERT", "PIP_CLIENT_CERT", "PIP_TRUSTED_HOST", "PIP_PROXY"}


def makefile_gpu_install() -> tuple[list[str], str]:
    """(the Makefile's GPU_PIP flags, the extras it installs beside $(EXTRA)): read, not copied, so
    this test resolves what `make` installs."""
    text = (ROOT / "Makefile").read_text()
    flags = re.search(r"^GPU_PIP := (.+)$", text, re.M).group(1).split()
    # Up to the CPU-only extras the Makefile appends with $(if ...): the CUDA install does not get them.
    extras = re.search(r"-e '\.\[\$\(EXTRA\),([^\]$]*)", text).group(1)
    return flags, extras


def pip(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in KEEP}
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf either: a CUDA box's pip, not this machine's
    return subprocess.run([sys.executable, "-m", "pip", *args, "--retries", "1", "--timeout", "30"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def skip_if_unreachable(result: subprocess.CompletedProcess) -> None:
    if result.returncode != 0 and (found := UNREACHABLE.search(result.stderr)):
        line = next(ln for ln in result.stderr.splitlines() if found.group(0) in ln)
        pytest.skip(f"the package registry cannot be reached: {line.strip()[:300]}")


@pytest.fixture(scope="module")
def resolved(tmp_path_factory) -> dict[str, dict]:
    """name -> the report's entry for every package `make` would install on a CUDA box."""
    tmp = tmp_path_factory.mktemp("pip")
    skip_if_unreachable(pip("index", "versions", "vllm", cwd=tmp, timeout=120))  # one request: fails fast offline
    flags, extras = makefile_gpu_install()
    # The project's metadata is all pip reads of it: a copy keeps setuptools' egg-info out of the checkout.
    project = tmp / "logicrl"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    report = tmp / "report.json"
    # fast-deps reads a wheel's metadata with HTTP range requests where the index serves no separate
    # metadata file; without it pip downloads every wheel it considers (4.7 GB here: torch twice, CUDA libraries).
    result = pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
                 "--use-feature=fast-deps", *flags, "-e", f".[gpu,{extras}]", cwd=project, timeout=900)
    skip_if_unreachable(result)
    assert result.returncode == 0, tail(result)
    return {entry["metadata"]["name"].lower(): entry for entry in json.loads(report.read_text())["install"]}


def test_vllm_and_torch_are_the_pinned_ones(resolved):
    assert {name: resolved[name]["metadata"]["version"] for name in PINNED} == PINNED


def test_every_package_comes_as_a_wheel_but_the_named_pure_python_ones(resolved):
    flags, _ = makefile_gpu_install()
    allowed = {name.lower() for flag in flags if flag.startswith("--no-binary=")
               for name in flag.removeprefix("--no-binary=").split(",")}
    not_wheels = {name: entry["download_info"]["url"] for name, entry in resolved.items()
                  if name != "logicrl" and not entry["download_info"]["url"].endswith(".whl")}
    assert set(not_wheels) <= allowed, not_wheels
    assert "dir_info" in resolved["logicrl"]["download_info"]  # the project itself, from this checkout

