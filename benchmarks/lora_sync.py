"""LoRA weight sync into vLLM: adapters only (rollout.lora_sync=adapters) against the merged model
(lora_sync=merged), bytes and seconds per sync, measured in one process on the same trainer model.

    .venv/bin/python benchmarks/lora_sync.py                 # 27M bench shape, LoRA r=32 all-linear, 5 syncs
    .venv/bin/python benchmarks/lora_sync.py --rank 8 --syncs 10
    .venv/bin/python benchmarks/lora_sync.py --nf4           # the same over an NF4 base (QLoRA)

Two in-process vLLM engines hold step_time.py's BENCH_MODEL base: one with LoRA enabled receives
weight_sync.iter_adapter_weights, the other iter_engine_weights (W + scale * B @ A). A sync's seconds
are the median of `--syncs`; after the last, both engines decode the same greedy prompts and the largest
|engine - trainer| log-prob is printed. With --nf4 the trainer's base is NF4 and the adapter engine
first takes the dequantized base once. A 7B shape's bytes are computed from its shapes
(memory/footprint.py). The measurements: docs/engines.md (its LoRA sync cost).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's logicrl, and benchmarks/ as a package
from benchmarks.step_time import bench_model_dir  # noqa: E402
from logicrl.memory.footprint import LINEARS, linear_shapes  # noqa: E402
from logicrl.models.loading import LoraSpec, QuantSpec, load_causal_lm  # noqa: E402
from logicrl.models.logprob import causal_lm_logprobs  # noqa: E402
from logicrl.models.spec import ModelSpec  # noqa: E402
from logicrl.workers.rollout.base import SamplingParams  # noqa: E402
from logicrl.workers.rollout.vllm import VLLMRolloutEngine  # noqa: E402
from logicrl.workers.weight_sync import iter_adapter_weights, iter_engine_weights  # noqa: E402

QWEN25_7B = ModelSpec(name="qwen2.5-7b", model_type="qwen2", num_layers=28, hidden_size=3584, num_heads=28,
                      num_kv_heads=4, head_dim=128, intermediate_size=18944, vocab_size=152064,
                      max_position_embeddings=32768, tie_word_embeddings=False, attention_bias=True)
PROMPTS = [[17, 250, 3, 99], [5, 6, 7, 8, 9, 10, 11], [42, 43]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def shape_bytes(spec: ModelSpec, rank: int, dtype_bytes: int = 2) -> tuple[int, int]:
    """(the whole model's bytes, the all-linear rank-`rank` adapters' bytes) of a decoder shape."""
    shapes = linear_shapes(spec)
    per_layer = sum(o * i for o, i in shapes.values()) + 2 * spec.hidden_size  # Linears, two RMSNorms
    if spec.attention_bias:
        per_layer += sum(shapes[n][0] for n in ("q_proj", "k_proj", "v_proj"))
    embeddings = spec.vocab_size * spec.hidden_size * (1 if spec.tie_word_embeddings else 2)
    model = spec.num_layers * per_layer + embeddings + spec.hidden_size  # + the final norm
    adapters = spec.num_layers * sum(rank * (i + o) for o, i in (shapes[n] for n in LINEARS))
    return model * dtype_bytes, adapters * dtype_bytes


def engine(path: str, lora: LoraSpec | None) -> VLLMRolloutEngine:
    return VLLMRolloutEngine(path, pad_id=0, eos_ids=[], max_model_len=256, kv_cache_gb=0.25, max_num_seqs=8,
                             max_num_batched_tokens=512, seed=0, lora=lora)


def logprob_gap(eng: VLLMRolloutEngine, actor) -> float:
    """Largest |engine - trainer| log-prob over the greedy responses to PROMPTS."""
    width = max(map(len, PROMPTS))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = (torch.arange(width) >= torch.tensor([width - len(p) for p in PROMPTS])[:, None]).long()
    out = eng.generate(ids, mask, GREEDY)
    full_mask = torch.cat([mask, out.response_attention_mask], dim=1)
    with torch.no_grad():
        lp, _ = causal_lm_logprobs(actor, torch.cat([ids, out.responses], dim=1), full_mask,
                                   (full_mask.cumsum(-1) - 1).clamp(min=0), GREEDY.max_tokens)
    return float((lp - out.log_probs)[out.response_mask.bool()].abs().max())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--nf4", action="store_true", help="the trainer's base quantized to NF4 (QLoRA)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    path = str(bench_model_dir())
    lora = LoraSpec(args.rank, 2 * args.rank, "all-linear")
    quant = QuantSpec("nf4", 64, 256) if args.nf4 else None
    actor = load_causal_lm(path, torch.float32, lora=lora, quant=quant).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in actor.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))

    results = {}
    for mode, lora_arg in (("adapters", lora), ("merged", None)):
        eng = engine(path, lora_arg)
        seconds, stats, base = [], {}, {}
        if lora_arg is not None and quant is not None:  # once: the engine loaded the checkpoint, not its 4-bit trip
            start = time.perf_counter()
            eng.sync_weights(iter_engine_weights(actor, 512, base, dtype=torch.float32, merge_lora=False))
            base["seconds"] = time.perf_counter() - start
        for _ in range(args.syncs):
            start = time.perf_counter()
            if lora_arg is not None:
                eng.sync_adapters(iter_adapter_weights(actor, torch.float32, stats))
            else:
                eng.sync_weights(iter_engine_weights(actor, 512, stats, dtype=torch.float32))
            seconds.append(time.perf_counter() - start)
        results[mode] = dict(bytes=stats["bytes"], seconds=statistics.median(seconds), gap=logprob_gap(eng, actor),
                             base=base)
        del eng

    total = sum(p.numel() for p in actor.parameters())
    print(f"27M bench shape ({total / 1e6:.1f}M parameters with adapters){' over an NF4 base' if args.nf4 else ''}, "
          f"LoRA r={args.rank} all-linear, fp32, {args.syncs} syncs each, one process")
    print(f"{'mode':<10}{'bytes/sync':>14}{'s/sync (median)':>18}{'max |logprob gap|':>20}")
    for mode, r in results.items():
        print(f"{mode:<10}{r['bytes']:>14,}{r['seconds']:>18.4f}{r['gap']:>20.2e}")
    a, m = results["adapters"], results["merged"]
    if a["base"]:
        print(f"adapters: the dequantized base once, before the first sync: {a['base']['bytes']:,} bytes, "
              f"{a['base']['seconds']:.4f} s")
    print(f"merged / adapters: {m['bytes'] / a['bytes']:.1f}x the bytes, {m['seconds'] / a['seconds']:.1f}x the time")
    model, adapters = shape_bytes(QWEN25_7B, args.rank)
    print(f"Qwen2.5-7B shape, r={args.rank} all-linear, bf16 (computed): merged {model / 2**30:.2f} GiB, adapters "
          f"{adapters / 2**20:.1f} MiB per sync: {model / adapters:.0f}x fewer bytes")


if __name__ == "__main__":
    main()
