"""QLoRA on one GPU (docs/quantization.md): an NF4 base under LoRA adapters through the real step loop,
its trainer/engine log-prob gap in bf16, its memory against the plan, and the dequantize transient the
plan counts.

Needs torchao (the quant extra; the GPU check machine may have to be given its wheel:
`pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64
torchao==0.18.0`, 3.4 MB). GPTQ checkpoints are refused (docs/quantization.md): nothing to check here.
"""

from __future__ import annotations

import pytest

from logicrl.config.phases import ARR
from tests.gpu.runs import QWEN25_05B, train, write_random_model
from tests.gpu.test_train_cuda import MEAN_GAP, PLAN_TOLERANCE, TWO_STEPS

pytestmark = pytest.mark.gpu
pytest.importorskip("torchao", reason="needs torchao (pip install -e '.[quant]')")
QLORA = [f"{ARR}.model.quantization=nf4", f"{ARR}.model.lora_rank=16", f"{ARR}.model.lora_alpha=32"]


def test_qlora_two_steps_in_bf16_keep_the_engine_on_the_4bit_policy(tmp_path):
    """The engine holds bf16 dequant(W) + BA, the trainer dequantizes W per Linear in bf16: the same
    function, so the gap is the bf16 run's (MEAN_GAP), not the NF4 rounding's (order 0.1 and more)."""
    rows = train([*TWO_STEPS, *QLORA], tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    print({r["step"]: (r["rollout/logprob_diff"], r["rollout/logprob_diff_max"]) for r in rows})
    for row in rows:
        assert "actor/pg_loss" in row
        assert row["rollout/logprob_diff"] < MEAN_GAP, row["rollout/logprob_diff"]


def test_qlora_plan_matches_max_memory_allocated_per_phase(tmp_path):
    from logicrl.config import compose, validate
    from logicrl.models.tiny import cache_root
    from logicrl.preflight.memory import check_memory
    from tests.conftest import BASE_BATCH

    model = write_random_model(QWEN25_05B, cache_root() / "qwen2.5-0.5b-random")
    run = [*TWO_STEPS, *QLORA, f"{ARR}.model.path={model}", "data.max_response_length=256"]
    rows = train(run, tmp_path)
    cfg, spec, plan = validate(compose([f"data.train_files={tmp_path / 'data' / 'train.jsonl'}",
                                        f"data.val_files={tmp_path / 'data' / 'test.jsonl'}", *BASE_BATCH, *run]))
    planned = check_memory(cfg, spec, plan).peaks_gb
    measured = {phase: max(r.get(f"perf/memory/{phase}/peak_gb", 0.0) for r in rows) for phase in planned}
    print({phase: (round(measured[phase], 3), planned[phase]) for phase in planned})
    off = {phase: (measured[phase], planned[phase]) for phase in planned
           if measured[phase] and abs(measured[phase] - planned[phase]) > PLAN_TOLERANCE * planned[phase]}
    assert not off, f"measured vs planned GB outside {PLAN_TOLERANCE:.0%}: {off}"


def test_the_dequantize_transient_is_what_the_plan_counts():
    """memory/footprint.py dequant_bytes: (8 + 3 x 2) bytes a weight in bf16, for Qwen2.5-0.5B's MLP."""
    import torch

    from logicrl.memory.footprint import dequant_bytes
    from logicrl.models.quantize import _import_nf4
    from logicrl.models.spec import ModelSpec

    _, _, to_nf4 = _import_nf4()
    weight = torch.randn(4864, 896, dtype=torch.bfloat16, device="cuda")
    nf4 = to_nf4(weight, 64, 256)
    del weight
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = nf4.get_original_weight()
    peak = torch.cuda.max_memory_allocated() - before
    spec = ModelSpec.from_dict(QWEN25_05B, "qwen2.5-0.5b")
    print({"measured": peak, "planned": dequant_bytes(spec, 2), "result": out.numel() * 2})
    assert abs(peak - dequant_bytes(spec, 2)) <= PLAN_TOLERANCE * dequant_bytes(spec, 2)
