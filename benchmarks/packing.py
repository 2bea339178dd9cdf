"""Packed (use_remove_padding) against padded micro-batches: the update's forward + backward, and
the forward-only log-prob pass, on the same batch, alternating, in one process.

    .venv/bin/python benchmarks/packing.py --rows 8 --micro 4 --prompt-len 32 --response-len 128 --repeats 2
    .venv/bin/python benchmarks/packing.py          # 16 rows x (96 + 256): several times longer

(The first took 10 minutes on 2 CPU cores shared with a load average of ~14; alone, about a tenth.)

The model is step_time.py's BENCH_MODEL (a 27M-parameter Qwen2 shape, random weights, fp32) built
from its config. The batch is laid out as the trainer lays it out (workers/hybrid.py _generate):
left-padded prompts of varied length, then right-padded responses whose lengths are drawn
uniformly from [response_len / 16, response_len], as RL responses spread (a few reach the cap,
most stop earlier). Each timed pass runs every micro-batch of `--micro` rows, as update_actor
(log-probs with entropy, a loss over real tokens, backward) and as old_log_prob (no grad). The
same micro-batches run both ways; only the padding differs, and the attention each is loaded with in
the trainer: padded on transformers' sdpa (with the padding mask), packed on the kernel
models/attention.py chooses here (on CPU the per-sequence SDPA). Prints each repeat's seconds and
the ratio packed / padded of the medians (below 1: packing is faster).
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


def one_pass(model, batch, micro: int, response_len: int, packed: bool, train: bool) -> float:
    ids, mask, pos, resp_mask = batch
    model.set_attn_implementation(packed_attention(packed, torch.device("cpu"), torch.float32) or "sdpa")
    start = time.perf_counter()
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
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=96)
    ap.add_argument("--response-len", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
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
    print(f"batch: {args.rows} rows x {batch[0].shape[1]} columns, micro-batches of {args.micro} rows; "
          f"real tokens {real} of {width} ({real / width:.0%})")
    for train, name in ((True, "update (fwd+bwd)"), (False, "log-prob (fwd)")):
        one_pass(model, batch, args.micro, args.response_len, True, train)  # warm-up, both ways
        one_pass(model, batch, args.micro, args.response_len, False, train)
        times = {False: [], True: []}
        for _ in range(args.repeats):
            for packed in (False, True):  # alternating, so load from other processes hits both alike
                times[packed].append(one_pass(model, batch, args.micro, args.response_len, packed, train))
        pad, pack = statistics.median(times[False]), statistics.median(times[True])
        print(f"{name}: padded {' '.join(f'{t:.2f}' for t in times[False])} s | "
              f"packed {' '.join(f'{t:.2f}' for t in times[True])} s | packed/padded {pack / pad:.2f}")


if __name__ == "__main__":
    main()
