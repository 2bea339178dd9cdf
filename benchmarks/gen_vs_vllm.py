"""logicrl's generate phase against vLLM alone, on the same prompts with the same sampling, in turn.

    .venv/bin/python benchmarks/gen_vs_vllm.py --runs 3

logicrl: the real HybridWorker (one rank, rollout.name=vllm, as update_floor.py builds it) running
its `generate` phase on 8 kk_role prompts x 8 samples: the engine woken from its sleep, its patched
sampler, every sampled token's log-prob, the TensorDict the trainer gets, the sleep after.
vLLM alone: a plain vllm.LLM in a subprocess of the same Python, on the same model (step_time.py's
BENCH_MODEL), fp32, eager, prefix caching on, generating the same 64 requests (each prompt 8 times,
one seed per request, drawn as logicrl draws them) at temperature 1, top_p 1, up to 128 tokens,
ignore_eos with the same stop ids, with the sampled tokens' log-probs. Each run's per-request seeds
are drawn as logicrl's engine draws them from the phase's seed, so both sample the same tokens
(each line reports the tokens generated); with random weights nearly every response runs all 128.
Differences left: vLLM alone runs its engine core in its default separate process.

The two alternate (the subprocess waits for a "go" on stdin), a first pair warms both up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TAG = "GEN_VS_VLLM"
PROMPTS, N, RESPONSE_LEN = 8, 8, 128


def vllm_child(spec_path: str) -> None:
    import vllm
    from vllm.inputs import TokensPrompt

    spec = json.loads(Path(spec_path).read_text())
    llm = vllm.LLM(model=spec["model"], dtype="float32", seed=0, max_model_len=spec["max_model_len"],
                   max_num_seqs=len(spec["prompts"]), max_num_batched_tokens=max(8192, spec["max_model_len"]),
                   enable_chunked_prefill=False, enforce_eager=True, enable_prefix_caching=True,
                   kv_cache_memory_bytes=2**30)
    print(f"{TAG} ready", flush=True)
    import torch

    while (line := sys.stdin.readline().split())[:1] == ["go"]:
        # The per-request seeds logicrl's engine draws from the phase's seed (rollout/vllm.py).
        g = torch.Generator().manual_seed(int(line[1]))
        seeds = torch.randint(0, 2**62, (len(spec["prompts"]),), generator=g).tolist()
        params = [vllm.SamplingParams(n=1, temperature=1.0, top_p=1.0, top_k=0, max_tokens=RESPONSE_LEN, seed=s,
                                      logprobs=0, detokenize=False, ignore_eos=True, stop_token_ids=spec["eos"])
                  for s in seeds]
        start = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]], params, use_tqdm=False)
        seconds = time.perf_counter() - start
        print(f"{TAG} {seconds:.4f} {sum(len(o.outputs[0].token_ids) for o in outs)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed pairs, after one warm-up pair")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vllm-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_child:
        vllm_child(args.vllm_child)
        return
    sys.path.insert(0, str(ROOT))
    from tensordict import TensorDict

    from benchmarks.step_time import bench_model_dir
    from benchmarks.update_floor import build_worker
    from logicrl.data.dataset import load_prompts
    from logicrl.models.loading import load_tokenizer
    from logicrl.trainer.batch import prompt_batch

    model_dir = bench_model_dir()
    worker, _ = build_worker(model_dir, PROMPTS, 16, args.threads, engine="vllm")
    tokenizer = load_tokenizer(str(model_dir))
    rows = [load_prompts(str(ROOT / "data/kk_role/train.parquet"), tokenizer, max_prompt_length=128)[i]
            for i in range(PROMPTS)]
    prompts = prompt_batch(rows, N, tokenizer.pad_token_id)
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    engine = worker.engine
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({
            "model": str(model_dir), "max_model_len": engine.max_model_len, "eos": list(engine.eos_ids),
            "prompts": [r[m.bool()].tolist() for r, m in zip(ids, mask)]}))
        child = subprocess.Popen([sys.executable, __file__, "--vllm-child", str(spec)], cwd=ROOT, text=True,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=(Path(tmp) / "vllm.log").open("w"),
                                 env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})

        def child_line() -> list[str]:
            for line in child.stdout:
                if line.startswith(TAG):
                    return line.split()[1:]
            sys.exit(f"vLLM alone ended early (exit {child.wait()}):\n" + (Path(tmp) / "vllm.log").read_text()[-3000:])

        child_line()  # ready
        times = {"logicrl": [], "vllm": []}
        try:
            for i in range(args.runs + 1):
                batch = TensorDict({"input_ids": ids, "attention_mask": mask}, batch_size=[len(ids)])
                start = time.perf_counter()
                out, _ = worker.run(batch, "generate", params=dict(temperature=1.0, max_tokens=RESPONSE_LEN, seed=i))
                ours = time.perf_counter() - start
                child.stdin.write(f"go {i * 1009}\n")  # HybridWorker: seed * 1009 + rank
                child.stdin.flush()
                alone, tokens = child_line()
                warm = " (warm-up)" if i == 0 else ""
                print(f"run {i}{warm}  logicrl generate {ours:7.2f} s ({int(out['response_mask'].sum())} tokens)   "
                      f"vLLM alone {float(alone):7.2f} s ({tokens} tokens)", flush=True)
                if i:
                    times["logicrl"].append(ours)
                    times["vllm"].append(float(alone))
        finally:
            child.stdin.close()
            child.wait(timeout=120)
    ratios = [a / b for a, b in zip(times["logicrl"], times["vllm"])]
    print(f"logicrl generate / vLLM alone per pair: {' '.join(f'{r:.2f}' for r in ratios)}; median "
          f"{statistics.median(ratios):.2f}; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
