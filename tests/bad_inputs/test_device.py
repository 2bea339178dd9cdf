"""The device asked for must be here: one line before Ray, not a plan and then a dead worker."""

from __future__ import annotations

import shutil

import pytest

from logicrl.memory.preflight import device_problem
from tests.bad_inputs.conftest import refused, small_run, timed_main


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has a GPU")
def test_cuda_asked_for_on_a_machine_without_it_is_one_line(tmp_path):
    result, seconds = timed_main(*small_run(tmp_path), "trainer.device=cuda")
    refused(result, seconds, "trainer.device=cuda", "no usable CUDA GPU", "trainer.device=cpu", bound=10)


def test_a_dry_run_may_plan_for_gpus_this_machine_lacks(tmp_path):
    result, _ = timed_main(*small_run(tmp_path), "trainer.device=cuda", "trainer.gpu_memory_gb=80",
                           "trainer.dry_run=true")
    assert result.returncode == 0, result.stderr[-2000:]


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
    result, seconds = timed_main(*small_run(tmp_path), "trainer.nnodes=2", "trainer.n_gpus_per_node=1")
    refused(result, seconds, "trainer.nnodes=2 needs a Ray cluster of that many nodes", "trainer.ray_address")
