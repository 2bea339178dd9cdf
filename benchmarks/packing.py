"""Packed (use_remove_padding) against padded micro-batches: the update's forward + backward, and
the forward-only log-prob pass, on the same batch, alternating, in one process.

    .venv/bin/python benchmarks/packing.py                    # 16 rows x (96 + 256), micro-batches of 4, 8, 16
    .venv/bin/python benchmarks/packing.py --micro 4 --profile 25     # where each way spends an update pass

step_time.py's BENCH_MODEL (27M parameters, random weights, fp32), on a batch laid out as the trainer
lays it out (left-padded prompts, right-padded responses of lengths drawn from [R / 16, R]). The same
micro-batches run both ways; padded on transformers' sdpa, packed on models/attention.py's kernel. On a
shared machine one timing is noise, so each comparison warms both up, times `--repeats` pairs with the
order flipped every pair and reports the median packed / padded ratio (below 1: packing is faster) with
quartiles and extremes (docs/memory.md, "Packed attention").
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's logicrl, and benchmarks/ as a package
from benchmarks.step_time import BENCH_MODEL  # noqa: E402
from logicrl.models.attention import packed_attention  # noqa: E402
from logicrl.models.logprob import causal_lm_logprobs  # noqa: E402


def build_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0):
    """[rows, P+R] input_ids, attention_mask, position_ids (cumsum - 1) and the response mask."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(prompt_len // 2, prompt_len + 1, (rows,), generator=g)
    responses = torch.randint(max(1, response_len // 16), response_len + 1, (rows,), generator=g)
    ids = torch.zeros(rows, prompt_len + response_len, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts.tolist(), responses.tolist())):
        ids[i, prompt_len - p: prompt_len + r] = torch.randint(1, vocab, (p + r,), generator=g)
        mask[i, prompt_len - p: prompt_len + r] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), mask[:, prompt_len:]


def one_pass(model, batch, micro: int, response_len: int, packed: bool, train: bool) -> tuple[float, float]:
    """(wall seconds, this process's CPU seconds) of one pass over the batch."""
    ids, mask, pos, resp_mask = batch
    model.set_attn_implementation(packed_attention(packed, torch.device("cpu"), torch.float32) or "sdpa")
    start, cpu = time.perf_counter(), time.process_time()
    for s in range(0, ids.shape[0], micro):
        rows = slice(s, s + micro)
        with torch.enable_grad() if train else torch.no_grad():
            logp, ent = causal_lm_logprobs(model, ids[rows], mask[rows], pos[rows], response_len,
                                           with_entropy=train, remove_padding=packed)
            if train:
                m = resp_mask[rows].float()
                ((-logp + 0.01 * ent) * m).sum().div(m.sum()).backward()
    if train:
        model.zero_grad(set_to_none=True)
    return time.perf_counter() - start, time.process_time() - cpu


def compare(model, batch, micro: int, response_len: int, train: bool, repeats: int, warmup: int) -> dict:
    """Padded and packed passes interleaved in pairs, the order flipped every pair (padded first, then
    packed first), after `warmup` passes of each: load from other processes that rises or falls during
    a pair, or across the run, then hits both alike. The ratio is the median of each pair's own
    packed / padded; its spread is the pairs' quartiles and extremes. Both in wall time and in this
    process's CPU time, which other processes' load changes far less (time spent waiting for a core is
    not counted), though spinning OpenMP threads count theirs."""
    for _ in range(warmup):
        for packed in (True, False):
            one_pass(model, batch, micro, response_len, packed, train)
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for i in range(repeats):
        for packed in ((False, True) if i % 2 == 0 else (True, False)):
            times[packed].append(one_pass(model, batch, micro, response_len, packed, train))
    out = {}
    for clock, k in (("wall", 0), ("cpu", 1)):
        ratios = sorted(b[k] / a[k] for a, b in zip(times[False], times[True]))
        quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
        out[clock] = {"padded": [t[k] for t in times[False]], "packed": [t[k] for t in times[True]],
                      "ratio": statistics.median(ratios), "q1": quartiles[0], "q3": quartiles[2],
                      "low": ratios[0], "high": ratios[-1]}
    return out


def profile(model, batch, micro: int, response_len: int, rows: int) -> None:
    """The ops each way spends the most CPU time in, over one update pass (forward + backward)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    for packed in (False, True):
        one_pass(model, batch, micro, response_len, packed, True)  # warm-up
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            one_pass(model, batch, micro, response_len, packed, True)
        print(f"\n{'packed' if packed else 'padded'}, {micro} rows per micro-batch, update pass:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--micro", default="4,8,16", help="rows per micro-batch, comma-separated: one comparison each")
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=7, help="timed (padded, packed) pairs per comparison")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes each way before them")
    # One thread: on cores shared with other jobs a second OpenMP thread spins while its partner waits for a
    # core, which slows the pass by whatever the load is and counts as this process's CPU time.
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", type=int, default=0, metavar="OPS",
                    help="instead: profile one update pass each way at the first --micro, print the top OPS ops")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(vocab_size=2048, tie_word_embeddings=True, **BENCH_MODEL),
                                             dtype=torch.float32).train()
    print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, "
          f"attention: padded sdpa, packed {packed_attention(True, torch.device('cpu'), torch.float32)}, "
          f"threads={args.threads}")
    batch = build_batch(args.rows, args.prompt_len, args.response_len, 2048)
    real, width = int(batch[1].sum()), batch[1].numel()
    micros = [int(m) for m in args.micro.split(",")]
    print(f"batch: {args.rows} rows x {batch[0].shape[1]} columns, micro-batches of {args.micro} rows; "
          f"real tokens {real} of {width} ({real / width:.0%}); {args.repeats} pairs after {args.warmup} warm-up")
    if args.profile:
        profile(model, batch, micros[0], args.response_len, args.profile)
        return
    summary = []
    for micro in micros:
        for train, name in ((True, "update (fwd+bwd)"), (False, "log-prob (fwd)")):
            r = compare(model, batch, micro, args.response_len, train, args.repeats, args.warmup)
            for clock in ("wall", "cpu"):
                print(f"micro {micro:>2} {name} {clock}: padded {' '.join(f'{t:.2f}' for t in r[clock]['padded'])} s"
                      f" | packed {' '.join(f'{t:.2f}' for t in r[clock]['packed'])} s", flush=True)
            summary.append((micro, name.split()[0], r))
    print("\npacked / padded, the median of the pairs' ratios [quartiles] (extremes), wall time; CPU time:")
    for micro, name, r in summary:
        print(f"  micro {micro:>2} {name:<9} " + "; ".join(
            f"{c['ratio']:.2f} [{c['q1']:.2f}-{c['q3']:.2f}] ({c['low']:.2f}-{c['high']:.2f})"
            for c in (r["wall"], r["cpu"])) +
            f"; median padded {statistics.median(r['wall']['padded']):.2f} s wall")
    for clock in ("wall", "cpu"):
        losing = [f"micro {m} {n}" for m, n, r in summary if r[clock]["ratio"] > 1.0]
        print(f"{clock}: packed <= padded in {len(summary) - len(losing)} of {len(summary)}" +
              (f"; above 1.0: {', '.join(losing)}" if losing else ""))

if __name__ == "__main__":
    main()
