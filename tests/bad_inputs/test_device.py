"""The device asked for must be here: one line before Ray, not a plan and then a dead worker.

CUDA asked for on this CPU machine runs the real entry point (exit code, stderr, seconds); the others
run its checks in-process (`check_main`), with the environment a launch would get set by monkeypatch.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from logicrl.preflight.device import device_problem, unusable_gpus_problem
from tests.bad_inputs.conftest import refused, small_run, timed_main
from tests.conftest import assert_refused, check_main

# What an H100 box on a driver too old for PyPI's CUDA 13 torch shows: nvidia-smi lists the GPUs,
# torch.cuda.is_available() is False (as it is for this machine's CPU torch).
FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"; echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)";;
  *driver_version*) echo "550.54.15"; echo "550.54.15";;
  *) exit 1;;
esac
"""


def fake_gpu_path(tmp_path: Path, monkeypatch) -> None:
    """PATH with a fake nvidia-smi first: two GPUs on driver 550."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_NVIDIA_SMI)
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
@pytest.mark.integration
def test_cuda_asked_for_on_a_machine_without_it_is_one_line(tmp_path):
    result, seconds = timed_main(*small_run(tmp_path), "trainer.device=cuda")
    refused(result, seconds, "trainer.device=cuda", "no usable CUDA GPU", "trainer.device=cpu", bound=10)


def test_a_dry_run_may_plan_for_gpus_this_machine_lacks(tmp_path):
    result = check_main(*small_run(tmp_path), "trainer.device=cuda", "trainer.gpu_memory_gb=80", "trainer.dry_run=true")
    assert result.code == 0, result.line


@pytest.mark.parametrize("device, ranks, nnodes, gpus, says", [
    ("cuda", 1, 1, 0, "trainer.device=cuda but this machine has no usable CUDA GPU"),
    ("auto", 8, 1, 4, "trainer.n_gpus=8 puts 8 rank(s) on this node but it has 4 visible GPU(s): lower "
                      "trainer.n_gpus to 4"),
    ("cuda", 16, 2, 4, "trainer.n_gpus=16 puts 8 rank(s) on this node but it has 4 visible GPU(s): lower "
                       "trainer.n_gpus to 8"),
])
def test_too_few_gpus_name_both_numbers(device, ranks, nnodes, gpus, says):
    assert device_problem(device, ranks, nnodes, gpus) == says or says in device_problem(device, ranks, nnodes, gpus)


@pytest.mark.parametrize("device, ranks, nnodes, gpus", [
    ("auto", 4, 1, 0),  # auto on a CPU machine: CPU ranks
    ("cpu", 8, 1, 2),  # CPU ranks whatever the GPUs
    ("cuda", 4, 1, 4),
    ("cuda", 8, 2, 4),
])
def test_what_fits_passes(device, ranks, nnodes, gpus):
    assert device_problem(device, ranks, nnodes, gpus) is None


def test_several_nodes_without_a_cluster_to_join_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    result = check_main(*small_run(tmp_path), "trainer.nnodes=2", "trainer.n_gpus_per_node=1")
    assert_refused(result, "trainer.nnodes=2 needs a Ray cluster of that many nodes", "trainer.ray_address")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_gpus_torch_cannot_use_stop_the_run_with_one_line(tmp_path, monkeypatch, device):
    """The silent fallback this replaces: trainer.device=auto trained on the CPU beside idle GPUs."""
    fake_gpu_path(tmp_path, monkeypatch)
    result = check_main(*small_run(tmp_path), f"trainer.device={device}", "trainer.dry_run=true")
    assert_refused(result, f"trainer.device={device}", "cannot use the 2 GPU(s) nvidia-smi lists",
            "driver 550.54.15", "torch.version.cuda=None", "CPU build", "trainer.device=cpu")


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_the_cpu_on_purpose_is_not_refused(tmp_path, monkeypatch):
    fake_gpu_path(tmp_path, monkeypatch)
    result = check_main(*small_run(tmp_path), "trainer.device=cpu", "trainer.dry_run=true")
    assert result.code == 0, result.line


@pytest.mark.parametrize("driver, cuda, visible, says", [
    # PyPI's torch 2.13 on an H100 box still on 550: the case the Makefile's driver check also stops.
    ("550.54.15", "13.0", None, "CUDA 13.0 needs NVIDIA driver >= 580; upgrade the driver"),
    ("535.183.01", "12.8", None, "check the driver (nvidia-smi, dmesg)"),  # new enough for CUDA 12 (>= 525)
    ("580.65.06", "13.0", "", "check CUDA_VISIBLE_DEVICES='' (an empty value hides every GPU)"),
    ("580.65.06", "13.0", None, "check the driver (nvidia-smi, dmesg)"),
    ("unknown", "13.0", None, "CUDA 13.0 needs NVIDIA driver >= 580"),
])
def test_the_fix_named_follows_the_cause(driver, cuda, visible, says):
    line = unusable_gpus_problem("auto", 8, driver, "2.13.0", cuda, visible)
    assert line.startswith(f"trainer.device=auto but torch 2.13.0 cannot use the 8 GPU(s) nvidia-smi lists "
                           f"(driver {driver}, torch.version.cuda={cuda})")
    assert line.endswith("or set trainer.device=cpu to train on the CPU on purpose")
    assert "\n" not in line and says in line


@pytest.mark.parametrize("device, gpus", [("cpu", 8), ("auto", 0), ("cuda", 0)])
def test_no_listed_gpus_or_the_cpu_on_purpose_is_no_problem(device, gpus):
    assert unusable_gpus_problem(device, gpus, "550.54.15", "2.13.0", "13.0", None) is None
