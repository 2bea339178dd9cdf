"""logicrl's update_actor against the floor: a plain HF forward + backward + AdamW step on the same tokens.

    .venv/bin/python benchmarks/update_floor.py                  # 3 alternating pairs, 1 thread
    .venv/bin/python benchmarks/update_floor.py --runs 5 --threads 2
    .venv/bin/python benchmarks/update_floor.py --profile        # where logicrl's extra time goes

Both sides train step_time.py's 27M-parameter Qwen2 (BENCH_MODEL, random weights, fp32) on 64
sequences of an 8-token prompt and a 128-token response, in micro-batches of --micro rows, one
optimizer step, on the same threads. logicrl: the real HybridWorker's update_actor (one rank, FSDP2
over gloo; chunked log-probs and entropy, clipped loss with the entropy bonus, grad clip, AdamW, its
metrics, the phase wrapper's timing and memory). The floor: full logits, log_softmax + gather,
-(A * logp) token-mean, backward per micro-batch, clip_grad_norm_, AdamW: what any trainer must do.
The two alternate, so the shared machine's load falls on both alike; a first pair warms up, uncounted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a script: find logicrl from any directory

from logicrl.config.phases import ARR

PROMPTS, N, PROMPT_LEN, RESPONSE_LEN = 8, 8, 8, 128


def make_batch(pad_id: int, prompts: int = PROMPTS):
    """The update's batch: 64 rows of [8 prompt | 128 response] tokens, advantages per sequence."""
    import torch
    from tensordict import TensorDict

    g = torch.Generator().manual_seed(0)
    rows = prompts * N
    prompts = torch.randint(10, 1000, (prompts, PROMPT_LEN), generator=g).repeat_interleave(N, dim=0)
    responses = torch.randint(10, 1000, (rows, RESPONSE_LEN), generator=g)
    lengths = torch.full((rows,), RESPONSE_LEN)
    lengths[::8] = torch.randint(16, RESPONSE_LEN, (rows // 8,), generator=g)  # ~ what EOS does to a few
    response_mask = (torch.arange(RESPONSE_LEN)[None] < lengths[:, None]).long()  # [64, 128]
    responses = torch.where(response_mask.bool(), responses, pad_id)
    attention_mask = torch.cat([torch.ones(rows, PROMPT_LEN, dtype=torch.long), response_mask], dim=1)
    advantages = torch.randn(rows, 1, generator=g) * response_mask  # GRPO: one value per sequence
    return TensorDict({
        "input_ids": torch.cat([prompts, responses], dim=1),  # [64, 136]
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": responses, "response_mask": response_mask, "advantages": advantages.float(),
    }, batch_size=[rows])


def build_worker(model_dir: Path, prompts: int, micro: int, threads: int, engine: str = "hf"):
    from omegaconf import OmegaConf

    from logicrl.config import compose, validate
    from logicrl.controller.ports import free_port
    from logicrl.workers.hybrid import HybridWorker

    data = ROOT / "data/kk_role"
    if not (data / "train.parquet").is_file():
        sys.exit("data/kk_role is missing: run `make data`")
    cfg, _, plan = validate(compose([
        f"{ARR}.model.path={model_dir}", f"data.train_files={data}/train.parquet",
        f"data.val_files={data}/test.parquet",
        f"data.train_batch_size={prompts}", f"{ARR}.rollout.n={N}", f"{ARR}.actor.ppo_mini_batch_size={prompts}",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu={micro}", f"data.max_response_length={RESPONSE_LEN}",
        f"{ARR}.rollout.name={engine}", f"{ARR}.actor.use_kl_loss=false", "trainer.device=cpu"]))
    worker = HybridWorker(OmegaConf.to_container(cfg, resolve=True), plan, 0, 1, "127.0.0.1", free_port(),
                          threads=threads)
    return worker, cfg[ARR].actor


class Floor:
    """A plain HF forward + backward + AdamW step, micro-batched like logicrl's update."""

    def __init__(self, model_dir: Path, actor_cfg, micro: int):
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=actor_cfg.optim.lr,
                                           weight_decay=actor_cfg.optim.weight_decay, betas=(0.9, 0.999))
        self.micro, self.grad_clip = micro, actor_cfg.grad_clip

    def update(self, batch) -> None:
        import torch

        mask_total = batch["response_mask"].sum()
        for mb in batch.split(self.micro):
            logits = self.model(input_ids=mb["input_ids"], attention_mask=mb["attention_mask"],
                                position_ids=mb["position_ids"], use_cache=False).logits  # [m, T, V]
            logp = torch.log_softmax(logits[:, PROMPT_LEN - 1:-1].float(), dim=-1)  # [m, R, V]
            logp = logp.gather(-1, mb["responses"][..., None]).squeeze(-1)  # [m, R]
            loss = -(logp * mb["advantages"] * mb["response_mask"]).sum() / mask_total
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def profile(worker, batch, top: int) -> None:
    """torch.profiler over one logicrl update: the ops by self CPU time."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        worker.run(batch.clone(), "update_actor")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed pairs, after one warm-up pair")
    # One thread: on 2 shared, loaded cores OpenMP's spinning threads make both sides several times slower.
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="prompts (x8 samples) in the batch")
    parser.add_argument("--micro", type=int, default=16, help="rows per micro-batch (ppo_micro_batch_size_per_gpu)")
    parser.add_argument("--profile", action="store_true", help="profile one logicrl update instead of timing")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    import torch

    from benchmarks.step_time import bench_model_dir

    model_dir = bench_model_dir()
    worker, actor_cfg = build_worker(model_dir, args.prompts, args.micro, args.threads)
    torch.set_num_threads(args.threads)  # the worker set it; said again for the floor's sake
    batch = make_batch(worker.engine.pad_id, args.prompts)
    floor = Floor(model_dir, actor_cfg, args.micro)
    load = os.getloadavg()[0]
    print(f"27M Qwen2 fp32, {len(batch)} x {batch['input_ids'].shape[1]} tokens, micro {args.micro}, "
          f"{torch.get_num_threads()} threads, load {load:.1f} on {os.cpu_count()} CPUs")
    if args.profile:
        worker.run(batch.clone(), "update_actor")  # warm-up
        profile(worker, batch, args.top)
        return

    times = {"logicrl": [], "floor": []}
    for i in range(args.runs + 1):
        for name, step in (("logicrl", lambda: worker.run(batch.clone(), "update_actor")),
                           ("floor", lambda: floor.update(batch))):
            start = time.perf_counter()
            step()
            seconds = time.perf_counter() - start
            print(f"run {i}{' (warm-up)' if i == 0 else ''}  {name:<8}{seconds:8.2f} s", flush=True)
            if i:
                times[name].append(seconds)
    ratios = [a / b for a, b in zip(times["logicrl"], times["floor"])]
    print(f"logicrl {statistics.median(times['logicrl']):.2f} s, floor {statistics.median(times['floor']):.2f} s "
          f"(medians); logicrl / floor per pair: {' '.join(f'{r:.2f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.2f}; load now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
