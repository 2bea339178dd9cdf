"""The plan under use_remove_padding: the same worst-case tokens, all real; only the attention mask changes."""

import importlib.util

import pytest

from logicrl.config import compose, validate
from logicrl.memory.footprint import ModelBytes
from logicrl.memory.planner_inputs import PlanInputs, packing_kernel
from logicrl.memory.phases import backward_phase
from tests.conftest import write_jsonl
from tests.memory.test_memory_fit import ARR, GRPO_7B


@pytest.fixture(scope="module")
def x(tmp_path_factory):
    data = write_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", 16)
    cfg, spec, plan = validate(compose([f"data.train_files={data}", f"data.val_files={data}", *GRPO_7B,
                                        f"{ARR}.model.use_remove_padding=true"]))
    return PlanInputs.from_plan(plan, cfg, spec, "cuda")


def test_packing_kernel_is_read_from_the_config(x):
    kernel = "flash" if importlib.util.find_spec("flash_attn") else "sdpa"  # bf16 on cuda: flash when installed
    assert x.packing == kernel and x.critic_packing == kernel  # the critic follows the actor's key
    assert packing_kernel(True, "cpu", 4) == "sdpa" and packing_kernel(True, "cuda", 4) == "sdpa"  # no fp32 flash
    assert packing_kernel(False, "cuda", 2) is None


def test_update_actor_activations_change_by_the_mask_alone(x):
    """Micro-batch of 16 full rows: 16 x 2560 tokens. Padded, each layer saves the mask SDPA converts to
    bf16, 2 bytes x 2560 keys per token, plus one bool [16, 2560, 2560] mask; flash-attn varlen saves
    neither; sdpa on the packed row has L = 40960 keys per token instead of 2560."""
    m = ModelBytes.build(x.spec, dtype_bytes=2, world=x.world)
    tokens, width, layers = 16 * 2560, 2560, x.spec.num_layers
    assert x.width == width and x.split("update_actor") == (16, None) and not x.actor_ckpt

    def top(packing):
        phase = backward_phase("update_actor", x, m, x.spec, {}, *x.split("update_actor"), x.actor_per_rank_mini,
                               ckpt=False, lm=True, packing=packing)
        assert phase.moment == "top"
        return phase.parts["activations"]

    padded = top(None)
    assert padded - top("flash") == layers * tokens * 2 * width + tokens * width
    assert top("sdpa") - padded == layers * tokens * 2 * (tokens - width) + tokens * (tokens - width)
