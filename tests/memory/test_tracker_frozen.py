"""The CPU tensor count sees tensors that gc.freeze() hid (vLLM freezes the heap once its engine is built)."""

import gc

import torch

from logicrl.memory.tracker import live_tensor_bytes


def test_a_frozen_tensor_is_counted():
    before = live_tensor_bytes("cpu")
    held = [torch.zeros(1024, 256)]  # 1 MiB, reachable from `held`
    gc.freeze()
    try:
        assert live_tensor_bytes("cpu") - before == 1024 * 256 * 4
        assert gc.get_freeze_count() == 0  # left unfrozen: later garbage stays collectable
    finally:
        gc.unfreeze()
        del held
