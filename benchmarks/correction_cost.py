"""What rollout correction adds to the actor's update: its tensor work per micro-batch against the
micro-batch's forward and backward, measured in one run.

    .venv/bin/python benchmarks/correction_cost.py [--rows 16] [--response 128] [--repeats 15] [--device cpu]

The model is step_time.py's --bench-model (a 27M-parameter Qwen2, random weights); a micro-batch is
--rows responses of --response tokens after a 32-token prompt. "update" is what the actor's loss_fn does
without correction (log-probs and entropy, the loss, backward); "correction" is what it adds: the IS weights
and their metrics, token and geometric rejection, the mismatch metrics, and the weights applied to the
loss. Both run interleaved, --repeats times each after a warm-up; the table gives medians and the ratio.
The update phase is the whole step's largest part on CPU, so the ratio bounds the step's share from above.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.step_time import bench_model_dir  # noqa: E402
from logicrl.algos import (  # noqa: E402
    RolloutCorrection,
    agg_loss,
    apply_correction,
    compute_policy_loss,
    entropy_bonus,
    mismatch_metrics,
    parse_rejection,
)
from logicrl.models.logprob import causal_lm_logprobs  # noqa: E402

PROMPT = 32
CORRECTION = RolloutCorrection(rollout_is="token", rejection=parse_rejection("token,geometric", "0.5_2.0,0.9_1.1"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--response", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(bench_model_dir(), dtype=torch.float32).to(device).train()
    g = torch.Generator().manual_seed(0)
    rows, width = args.rows, PROMPT + args.response
    ids = torch.randint(0, 2048, (rows, width), generator=g).to(device)
    attention = torch.ones(rows, width, dtype=torch.long, device=device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    mask = torch.ones(rows, args.response, dtype=torch.long, device=device)
    advantages = torch.randn(rows, 1, generator=g).expand(rows, args.response).to(device)
    with torch.no_grad():
        old = causal_lm_logprobs(model, ids, attention, positions, args.response)[0]
    rollout = old + 0.01 * torch.randn(old.shape, generator=g).to(device)  # an engine a little off

    def update(correct: bool) -> float:
        start = time.perf_counter()
        log_probs, entropy = causal_lm_logprobs(model, ids, attention, positions, args.response, with_entropy=True)
        weights = None
        if correct:
            out = apply_correction(old, rollout, mask, CORRECTION)
            weights, stats = out.weights, {**out.metrics, **mismatch_metrics(old, rollout, mask)}
        loss = compute_policy_loss("vanilla", log_probs, old, advantages, mask, clip_ratio_low=0.2,
                                   clip_ratio_high=0.2, rollout_is_weights=weights).token_loss
        loss = loss + entropy_bonus(entropy, mask, 0.01)
        if correct:
            loss = torch.where(out.keep, loss, loss.new_zeros(()))
            torch.stack(list(stats.values())).tolist()  # the metrics' one host copy
        agg_loss(loss, mask, "token-mean", normalizer=float(mask.sum()), max_response_length=args.response).backward()
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    def correction_only() -> float:
        start = time.perf_counter()
        out = apply_correction(old, rollout, mask, CORRECTION)
        stats = {**out.metrics, **mismatch_metrics(old, rollout, mask)}
        torch.stack(list(stats.values())).tolist()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for _ in range(2):  # warm-up
        update(False), update(True), correction_only()
    plain, corrected, alone = [], [], []
    for _ in range(args.repeats):
        plain.append(update(False))
        corrected.append(update(True))
        alone.append(correction_only())
    p, c, a = (statistics.median(x) for x in (plain, corrected, alone))
    print(f"device {device}, torch threads {torch.get_num_threads()}, micro-batch {rows} x {args.response} tokens, "
          f"{args.repeats} repeats (medians)")
    print(f"update without correction   {p * 1e3:9.2f} ms")
    print(f"update with correction      {c * 1e3:9.2f} ms   ({(c / p - 1) * 100:+.2f}%, noise included)")
    print(f"correction's own work       {a * 1e3:9.2f} ms   ({a / p * 100:.2f}% of the update)")


if __name__ == "__main__":
    main()
