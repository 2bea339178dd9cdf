"""QLoRA on one GPU (docs/quantization.md): an NF4 base under LoRA adapters through the real step loop,
its trainer/engine log-prob gap in bf16, its memory against the plan, and the dequantize transient the
plan counts.

Needs torchao (the quant extra; the GPU check machine may have to be given its wheel:
`pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64
torchao==0.18.0`, 3.4 MB). GPTQ checkpoints (the gptq extra) have no CUDA check yet: gptqmodel and
four of its dependencies are sdists, pypcre a C extension (docs/quantization.md).
"""

from __future__ import annotations

import pytest
import torch

from logicrl.config.phases import ARR

pytestmark = pytest.mark.gpu
pytest.importorskip("torchao", reason="needs torchao (pip install -e '.[quant]')")
QLORA = [f"{ARR}.model.quantization=nf4", f"{ARR}.model.lora_rank=16", f"{ARR}.model.lora_alpha=32"]
# The same numbers as tests/gpu/test_train_cuda.py (imported from there where Hydra is installed).
MEAN_GAP, PLAN_TOLERANCE = 0.02, 0.15
# Qwen2.5-0.5B's shape (tests/gpu/runs.py QWEN25_05B), kept here so the first two tests need only torch,
# transformers, peft and torchao.
QWEN25_05B = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
              "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": True, "head_dim": 64}


def _token_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)


def test_nf4_lora_on_cuda_agrees_with_the_merged_bf16_weights_the_engine_gets():
    """The trainer's QLoRA forward (each Linear dequantized into bf16, plus the adapters) against a plain
    bf16 model holding what the weight sync sends (dequant(W) + scale B A, workers/weight_sync.py): the
    same function, so their log-probs differ by the bf16 bound (MEAN_GAP). Against the unquantized bf16
    model the gap is the NF4 rounding's, far above it: the check tells the two apart."""
    import transformers
    from peft import LoraConfig, get_peft_model

    from logicrl.models.quantize import quantize_base
    from logicrl.workers.weight_sync import iter_engine_weights

    device = torch.device("cuda")
    config = transformers.Qwen2Config(**{k: v for k, v in QWEN25_05B.items() if k != "model_type"})
    torch.manual_seed(0)
    original = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device).eval()
    trained = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device)
    trained.load_state_dict(original.state_dict())
    assert quantize_base(trained, "nf4", 64, 256, device) == 24 * 7
    trained = get_peft_model(trained, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                 lora_dropout=0.0, task_type="CAUSAL_LM")).eval()
    for name, p in trained.named_parameters():
        if "lora_B" in name:  # a trained adapter: B is no longer zero
            torch.nn.init.normal_(p, std=0.02)
    engine = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device).eval()
    engine.load_state_dict(dict(iter_engine_weights(trained, dtype=torch.bfloat16)), strict=False)
    ids = torch.randint(0, 2048, (4, 256), generator=torch.Generator().manual_seed(1)).to(device)
    qlora, synced, plain = (_token_logprobs(m, ids) for m in (trained, engine, original))
    gap, nf4_gap = (qlora - synced).abs(), (qlora - plain).abs()
    print({"engine gap mean/max": (gap.mean().item(), gap.max().item()),
           "vs unquantized mean": nf4_gap.mean().item()})
    assert gap.mean() < MEAN_GAP and gap.max() < 1.0
    assert nf4_gap.mean() > 5 * gap.mean()


def test_qlora_two_steps_in_bf16_keep_the_engine_on_the_4bit_policy(tmp_path):
    """The engine holds bf16 dequant(W) + BA, the trainer dequantizes W per Linear in bf16: the same
    function, so the gap is the bf16 run's (MEAN_GAP), not the NF4 rounding's (order 0.1 and more)."""
    pytest.importorskip("hydra", reason="the step loop composes its config with Hydra")
    from tests.gpu.runs import TWO_STEPS, train

    rows = train([*TWO_STEPS, *QLORA], tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    print({r["step"]: (r["rollout/logprob_diff"], r["rollout/logprob_diff_max"]) for r in rows})
    for row in rows:
        assert "actor/pg_loss" in row
        assert row["rollout/logprob_diff"] < MEAN_GAP, row["rollout/logprob_diff"]


def test_qlora_plan_matches_max_memory_allocated_per_phase(tmp_path):
    pytest.importorskip("hydra", reason="the step loop composes its config with Hydra")
    from logicrl.config import compose, validate
    from logicrl.models.tiny import cache_root
    from logicrl.preflight.memory import check_memory
    from tests.conftest import BASE_BATCH
    from tests.gpu.runs import TWO_STEPS, train, write_random_model

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
