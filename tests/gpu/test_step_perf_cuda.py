"""The update's MFU on a real GPU: two GRPO steps of a Qwen2.5-0.5B-shaped model (random weights) in bf16,
with gradient checkpointing, through the real step loop (tests/gpu/runs.py).

The FLOP formula is unit-tested by hand (tests/trainer/test_step_perf.py); what only a GPU shows is that
the device's name is in the peak table and the measured utilisation is a plausible fraction of it: above
0 and below 1, and the hardware count (one more forward for the recomputation) above the model count.
"""

from __future__ import annotations

import pytest

from logicrl.config.phases import ARR
from tests.gpu.runs import QWEN25_05B, train, write_random_model

pytestmark = pytest.mark.gpu


def test_update_mfu_is_a_fraction_of_the_devices_bf16_peak(tmp_path):
    import torch

    from logicrl.models.tiny import cache_root
    from logicrl.trainer.step_perf import peak_bf16_flops

    name = torch.cuda.get_device_name(0)
    if peak_bf16_flops(name) is None:
        pytest.skip(f"{name} is not in timeplan.devices.DEVICES")
    model = write_random_model(QWEN25_05B, cache_root() / "qwen2.5-0.5b-random")
    rows = train(["trainer.total_training_steps=2", "trainer.device=cuda", f"{ARR}.rollout.name=hf",
                  "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
                  f"{ARR}.model.path={model}", "data.max_response_length=256",
                  f"{ARR}.model.enable_gradient_checkpointing=true"], tmp_path)
    last = rows[-1]
    print(name, {k: round(v, 4) for k, v in last.items() if k.startswith("perf/") and "memory" not in k})
    assert 0 < last["perf/update_actor/mfu"] < 1
    assert last["perf/update_actor/hfu"] > last["perf/update_actor/mfu"]
    assert last["perf/gen_tokens_per_s"] > 0 and last["perf/update_actor/tokens_per_s"] > 0
