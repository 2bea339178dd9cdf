"""Would another precision make the embedded reward model's build the same bytes on every CPU?

    python benchmarks/tiny_rm_bytes.py [--dtype float64] [--threads 1] [--steps 20 200]

Trains the reward model exactly as models/tiny_rm.py builds it (same initial weights, data, batches and
optimizer), in --dtype on --threads, twice per step count: with torch's kernels as this CPU picks them and
held to AVX2 (benchmarks/tiny_rm_seeds.py's AVX2 environment; each run is a subprocess, so the environment
reaches torch before it loads). Prints, per step count, whether the weights cast to fp32 (what a float64
build would ship) are the same bytes, and the largest difference. A CPU without AVX-512 runs the same
kernels twice and proves nothing: the first line says which capability each side had.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def train(dtype: str, threads: int, steps: int, out: str) -> None:
    """One build, cut at `steps`, saved to `out` (runs in the subprocess)."""
    import torch

    torch.set_num_threads(threads)
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        Qwen2Config,
    )

    from logicrl.data.role_task import generate
    from logicrl.models import tiny_rm
    from logicrl.models.tiny import TINY_RM_CONFIG, tiny_checkpoint_dir

    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint_dir(), local_files_only=True)
    # The same config and initial weights as tiny_rm._write_checkpoint, then cast to `dtype`.
    config = Qwen2Config(**{k: v for k, v in TINY_RM_CONFIG.items() if k not in ("model_type", "num_labels")},
                         num_labels=1, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    config.vocab_size = len(tokenizer)
    torch.manual_seed(tiny_rm.SEED)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32).to(getattr(torch, dtype))
    splits = generate(tiny_rm.PEOPLE, tiny_rm.TRAIN_PROMPTS, tiny_rm.TEST_PROMPTS, tiny_rm.DATA_SEED)
    items = tiny_rm.examples(splits["train"], tokenizer, tiny_rm.RESPONSES_PER_PROMPT, seed=tiny_rm.SEED)
    losses = tiny_rm.train(model, items, tokenizer.pad_token_id, steps=steps, seed=tiny_rm.SEED)
    torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, out)
    print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "losses": losses}))


def compare(a: str, b: str) -> dict:
    import torch

    x, y = torch.load(a), torch.load(b)
    fp32 = {k: (x[k].float(), y[k].float()) for k in x}
    return {"identical_fp32": all(torch.equal(u, v) for u, v in fp32.values()),
            "differing": sum(int((u != v).sum()) for u, v in fp32.values()),
            "weights": sum(u.numel() for u, _ in fp32.values()),
            "max_diff": max(float((x[k].double() - y[k].double()).abs().max()) for k in x)}


def main() -> None:
    from benchmarks.tiny_rm_seeds import AVX2

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--train", nargs=3, metavar=("DTYPE", "STEPS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train:
        return train(args.train[0], args.threads, int(args.train[1]), args.train[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory() as tmp:
        for steps in args.steps:
            outs = []
            for name, extra in (("native", {}), ("avx2", AVX2)):
                out = f"{tmp}/{name}-{steps}.pt"
                run = subprocess.run([sys.executable, __file__, "--threads", str(args.threads), "--train", args.dtype,
                                      str(steps), out], env={**env, **extra}, check=True, capture_output=True,
                                     text=True)
                info = json.loads(run.stdout.strip().splitlines()[-1])
                print(f"{name}: {info['capability']} kernels, {args.dtype}, {args.threads} thread(s), {steps} steps, "
                      f"losses every 100 steps {info['losses']}", flush=True)
                outs.append(out)
            c = compare(*outs)
            print(f"  {steps} steps: fp32 casts identical: {c['identical_fp32']}; {c['differing']} of {c['weights']} "
                  f"fp32 weights differ; max |difference| {c['max_diff']:.3g}", flush=True)


if __name__ == "__main__":
    main()
