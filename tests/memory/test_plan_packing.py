"""The plan under use_remove_padding: the same worst-case tokens, all real; the attention keeps no mask
and K and V unrepeated (models/attention.py's kernels)."""

import importlib.metadata

import pytest

from logicrl.config.phases import ARR
from logicrl.memory.footprint import ModelBytes
from logicrl.memory.phases import backward_phase, batch_bytes
from logicrl.models.attention import FLASH, PACKED_SDPA, packed_kernel
from tests.memory.conftest import inputs


@pytest.fixture(scope="module")
def x(data):
    return inputs(data, f"{ARR}.model.use_remove_padding=true")[2]


def test_packing_kernel_is_read_from_the_config(x):
    # bf16 on cuda: flash when installed; never in fp32 (flash-attn has no fp32 kernels) or on CPU.
    flash = "flash-attn" in {d.metadata["Name"] for d in importlib.metadata.distributions()}
    kernel = FLASH if flash and x.device == "cuda" else PACKED_SDPA
    # Every model's key follows the actor's by default.
    assert {role: m.packing for role, m in x.models.items()} == dict.fromkeys(x.models, kernel)
    assert packed_kernel(True, "cpu", 4) == PACKED_SDPA and packed_kernel(True, "cuda", 4) == PACKED_SDPA
    assert packed_kernel(True, "cpu", 2) == PACKED_SDPA and packed_kernel(False, "cuda", 2) is None


def test_update_actor_activations_packed_keep_no_mask_and_unrepeated_kv(x):
    """Micro-batch of 16 full rows: 16 x 2560 tokens of Qwen2.5-7B (28 heads, 4 KV heads of 128: q is
    3584 wide, K and V 512 each). Padded, each layer saves q, K and V repeated to all 28 heads and the
    output, 4 x 3584 bf16 values, and the mask SDPA converts to bf16, 2560 keys; plus one bool
    [16, 2560, 2560] mask. Packed (either kernel) saves q, the output and the unrepeated K and V,
    2 x 3584 + 2 x 512 values, and no mask. No term grows with the micro-batch's tokens."""
    m = ModelBytes.build(x.spec, dtype_bytes=2, world=x.world)
    tokens, width, layers = 16 * 2560, 2560, x.spec.num_layers
    assert x.width == width and x.split("update_actor") == (16, None) and not x.models["actor"].ckpt

    def top(packing, rows=16):
        phase = backward_phase("update_actor", x, m, x.spec, {}, rows, None, x.models["actor"].per_rank_mini,
                               ckpt=False, lm=True, packing=packing)
        assert phase.moment == "top"
        return phase.parts["activations"]

    padded = top(None)
    per_token_layer = 2 * (4 * 3584 - (2 * 3584 + 2 * 512)) + 2 * width
    assert padded - top(PACKED_SDPA) == layers * tokens * per_token_layer + tokens * width
    assert top(FLASH) == top(PACKED_SDPA)
    # Linear in tokens: 16 rows keep twice what 8 keep, beside the rank's batch (held either way).
    assert top(PACKED_SDPA, 16) - batch_bytes(x) == 2 * (top(PACKED_SDPA, 8) - batch_bytes(x))
    assert top(None, 16) - batch_bytes(x) == 2 * (top(None, 8) - batch_bytes(x))  # padded: rows of fixed width


def test_the_plan_header_names_each_models_attention(x):
    from logicrl.memory.planner import format_table, plan_inputs

    kernel = x.models["actor"].packing
    lines = format_table(plan_inputs(x, 80 * 2**30)).splitlines()
    assert lines[1].startswith(f"attention: actor/ref packed on {kernel} (")  # no critic, no reward model here
    padded = x.with_model("actor", packing=None).with_model("ref", packing=None)
    padded = format_table(plan_inputs(padded, 80 * 2**30)).splitlines()[1]
    assert padded == "attention: actor/ref padded (sdpa, a [T, T] padding mask per row)"
