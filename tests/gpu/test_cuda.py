"""The smallest GPU check: the installed torch computes on the GPU, and the preflight agrees that it can."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_a_matmul_on_the_gpu_gives_the_hand_computed_sums():
    import torch

    a = torch.arange(6.0, device="cuda").reshape(2, 3)  # [[0, 1, 2], [3, 4, 5]]
    b = torch.ones(3, 2, device="cuda")
    assert (a @ b).cpu().tolist() == [[3.0, 3.0], [12.0, 12.0]]  # row sums 0+1+2, 3+4+5


def test_the_preflight_sees_usable_gpus():
    """The run-time refusal (preflight/device.check_gpus_usable) must not fire where CUDA works."""
    pytest.importorskip("omegaconf", reason="the preflight needs the full install (omegaconf)")
    from logicrl.preflight.device import _gpus_torch_cannot_use, visible_gpus

    _gpus_torch_cannot_use.cache_clear()
    assert _gpus_torch_cannot_use() is None
    assert visible_gpus() >= 1
