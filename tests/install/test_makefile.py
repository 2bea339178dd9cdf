"""The Makefile's checks before and after the install, run for real against a throwaway VENV.

Each refusal happens before `python -m venv`, so the test checks that no venv was made. The GPU box is
a fake `nvidia-smi` on PATH; the install itself is only printed (`make -n`), never run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")

OLD_PYTHON = """#!/bin/sh
# Python 3.10 as the Makefile sees it: fails the version check, reports its version.
case "$1" in --version) echo "Python 3.10.12";; *) exit 1;; esac
"""


def fake_nvidia_smi(tmp_path: Path, driver: str) -> dict:
    """The environment of a box with one H100 on `driver`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"""#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)";;
  *driver_version*) echo "{driver}";;
  *) exit 1;;
esac
""")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


# Under `make test` the parent make passes its own variables down (MAKEFLAGS carries e.g. PYTEST_ARGS=...),
# which would change the commands these tests read.
PARENT_MAKE = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "PYTEST_ARGS")


def make(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in (env or os.environ).items() if k not in PARENT_MAKE}
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


def lines(text: str) -> list[str]:
    """Each line with its runs of spaces made one (an empty make variable leaves two)."""
    return [" ".join(line.split()) for line in text.splitlines()]


def test_python_310_is_refused_before_the_venv_is_made(tmp_path):
    python = tmp_path / "python3.10"
    python.write_text(OLD_PYTHON)
    python.chmod(0o755)
    result = make("setup", f"VENV={tmp_path / 'venv'}", f"PYTHON={python}")
    assert result.returncode != 0
    assert (f"logicrl needs Python >= 3.11 (vLLM 0.32 publishes nothing older) and PYTHON={python} is Python "
            "3.10.12: run make PYTHON=python3.11 (or newer)") in lines(result.stderr)
    assert not (tmp_path / "venv").exists()


def test_a_missing_python_is_named(tmp_path):
    result = make("setup", f"VENV={tmp_path / 'venv'}", "PYTHON=python3-that-does-not-exist")
    assert result.returncode != 0
    assert "PYTHON=python3-that-does-not-exist is not found: run make PYTHON=python3.11" in result.stderr


def test_a_driver_older_than_cuda_13_needs_is_refused_before_the_venv_is_made(tmp_path):
    result = make("setup", f"VENV={tmp_path / 'venv'}", env=fake_nvidia_smi(tmp_path, "550.54.15"))
    assert result.returncode != 0
    line = next(ln for ln in result.stderr.splitlines() if ln.startswith("NVIDIA driver"))
    assert line.startswith("NVIDIA driver 550.54.15 is older than 580, which PyPI's torch 2.13 and vLLM 0.32 "
                           "(CUDA 13 builds) need: upgrade the driver")
    assert line.endswith("or build the CPU install with make EXTRA=cpu")
    assert not (tmp_path / "venv").exists()


def test_a_cuda_box_installs_the_gpu_extra_from_wheels_and_checks_cuda(tmp_path):
    venv = tmp_path / "venv"
    result = make("-n", "setup", f"VENV={venv}", env=fake_nvidia_smi(tmp_path, "580.65.06"))
    assert result.returncode == 0, result.stderr
    assert (f"{venv}/bin/python -m pip install -q --no-compile --only-binary=:all: --no-binary=antlr4-python3-runtime "
            "-e '.[gpu,test,slurm,quant]'") in lines(result.stdout)
    assert "torch.cuda.is_available() is False" in result.stdout
    assert not venv.exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_a_cpu_box_is_unchanged_cpu_extra_and_no_wheels_only(tmp_path):
    venv = tmp_path / "venv"
    result = make("-n", "setup", f"VENV={venv}")
    assert result.returncode == 0, result.stderr
    # One resolution with the CPU-only GPTQ extra, compiled on every core afterwards.
    assert f"{venv}/bin/python -m pip install -q --no-compile -e '.[cpu,test,slurm,quant,gptq]'" in lines(result.stdout)
    assert f"{venv}/bin/python -m compileall -q -j 0" in result.stdout
    assert f"{venv}/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec" in result.stdout


def test_test_gpu_runs_the_gpu_tier():
    result = make("-n", "test-gpu", "VENV=/nonexistent-venv")
    assert "/nonexistent-venv/bin/python -m pytest -m gpu tests/gpu" in lines(result.stdout)


def test_the_tiers_a_bare_pytest_make_test_and_make_test_all_run():
    # A bare `pytest` is the unit tier (pyproject's addopts); make test adds integration, make test-all
    # slow too; each make target's own -m replaces the addopts' one.
    import tomllib

    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "-m 'not integration and not slow and not gpu'" in addopts
    # Both on two xdist workers, a module (all of tests/slurm) at a time: tests/conftest.py's scheduler.
    tiers = {"test": '-m "not slow and not gpu"', "test-all": '-m ""'}
    for target, marks in tiers.items():
        result = make("-n", target, "VENV=/nonexistent-venv")
        assert (f"/nonexistent-venv/bin/python -m pytest {marks} -n 2 --dist loadscope --no-loadscope-reorder"
                in lines(result.stdout)), result.stdout
