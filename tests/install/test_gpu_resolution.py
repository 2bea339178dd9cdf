"""The CUDA install resolves from wheels only, to the pinned vLLM and torch.

pip resolves `-e '.[gpu,test,slurm,quant]'` with the Makefile's wheels-only flags, as `make` does on a CUDA
box, but with --dry-run --ignore-installed: nothing is installed, and this machine's Python (3.11,
x86_64 Linux, like the box's) stands in for the box's. This is the one test that reads the package
registry: it skips, with pip's own words, when the registry cannot be reached. It takes 70-115 s on
this 2-core machine under load (pip reads the metadata of 248 packages, one after another), mostly waiting:
under make test's xdist workers the controller starts it when the session begins, and the test reads what it
found (tests/helpers/pip_resolution.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.helpers.pip_resolution import makefile_gpu_install, outcome

pytestmark = pytest.mark.integration

PINNED = {"vllm": "0.32.0", "torch": "2.13.0"}
# pip's words for a registry it cannot reach (urllib3 and pip's own), as opposed to a failed resolution.
UNREACHABLE = re.compile(r"NewConnectionError|Max retries exceeded|Temporary failure in name resolution|"
                         r"Name or service not known|ProxyError|ConnectTimeout|ReadTimeout|Network is unreachable|"
                         r"Connection refused|SSLError|Could not fetch URL")


def skip_if_unreachable(result: dict) -> None:
    if result["returncode"] != 0 and (found := UNREACHABLE.search(result["stderr"])):
        line = next(ln for ln in result["stderr"].splitlines() if found.group(0) in ln)
        pytest.skip(f"the package registry cannot be reached: {line.strip()[:300]}")


@pytest.fixture(scope="module")
def resolved(request, tmp_path_factory) -> dict[str, dict]:
    """name -> the report's entry for every package `make` would install on a CUDA box: resolved by the xdist
    controller from the session's start where it could (tests/helpers/pip_resolution.py), else here."""
    early = getattr(request.config, "workerinput", {}).get("logicrl_pip_resolution")
    result = outcome(early, tmp_path_factory.mktemp("pip"))
    skip_if_unreachable(result)
    assert result["returncode"] == 0, f"pip's {result['step']} step failed:\n{result['stderr'][-3000:]}"
    return {entry["metadata"]["name"].lower(): entry
            for entry in json.loads(Path(result["report"]).read_text())["install"]}


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

