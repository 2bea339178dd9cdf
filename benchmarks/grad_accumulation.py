"""Sharded against unsharded gradient accumulation (fsdp_config.grad_accumulation) on 2 CPU ranks.

    .venv/bin/python benchmarks/grad_accumulation.py [--rounds 4] [--micro 4] [--rows 8] [--threads 1]

Both ranks run the real update loop (workers/update.py run_update) on the same mini-batch of
`--rows` rows per rank split into `--micro` micro-batches, one optimizer step, alternating the two
modes round by round (so drift in the machine's load hits both alike). unsharded syncs once, with
the last backward; sharded reduce-scatters after every backward. Printed: each mode's median
update time, the ratio sharded / unsharded, and the gradient bytes each rank holds while the
second micro-batch starts (the first one's gradients: full-size unsharded, a 1/2 shard sharded),
counted from FSDP2's parameters, not planned.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a script, not part of the package: find logicrl from any directory

from logicrl.controller.ports import free_port  # noqa: E402

# A Qwen2 shape big enough that the collectives are not lost in Python overhead (~10M parameters).
SHAPE = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
             intermediate_size=704, vocab_size=8192, tie_word_embeddings=True)
SEQ = 128


def held_grad_bytes(model: torch.nn.Module) -> int:
    """Gradient bytes on this rank: sharded .grad (local shards) plus FSDP2's unreduced, unsharded ones."""
    from torch.distributed.fsdp import FSDPModule

    total = 0
    for p in model.parameters():
        if p.grad is not None:
            local = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            total += local.numel() * local.element_size()
    for module in model.modules():
        if isinstance(module, FSDPModule):
            for group in module._get_fsdp_state()._fsdp_param_groups:
                for fp in group.fsdp_params:
                    for g in (fp.unsharded_accumulated_grad, getattr(getattr(fp, "_unsharded_param", None), "grad",
                                                                      None)):
                        if g is not None:
                            total += g.numel() * g.element_size()
    return total


def _rank(rank: int, world: int, port: int, args, out: str):
    import transformers
    from tensordict import TensorDict

    from logicrl.config.plan import Micro, Update
    from logicrl.workers.fsdp import build_optimizer, init_distributed, shard_model
    from logicrl.workers.oom import MicroSize
    from logicrl.workers.update import Trained, run_update

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    mesh = init_distributed(rank, world, "127.0.0.1", port, device)
    torch.manual_seed(0)
    model = shard_model(transformers.AutoModelForCausalLM.from_config(transformers.Qwen2Config(**SHAPE)), mesh, device)
    optimizer, scheduler = build_optimizer(model, 1e-4, 0.0, 1000, 0.0, "constant")
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(0, SHAPE["vocab_size"], (args.rows, SEQ), generator=g)
    batch = TensorDict({"input_ids": ids, "response_mask": torch.ones_like(ids)}, batch_size=[args.rows])
    rows = args.rows // args.micro
    key = "ppo_micro_batch_size_per_gpu"
    update = Update(mini_prompts=args.rows, per_rank_mini=args.rows, micro=Micro(key, rows), ppo_epochs=1, num_mini=1)
    held: dict[str, int] = {}

    def loss_fn(micro, normalizer):
        calls[0] += 1
        if calls[0] == 2:  # the second micro-batch starts: the first one's gradients, as kept
            held.setdefault("sharded" if role.sharded_grads else "unsharded", held_grad_bytes(model))
        logits = model(input_ids=micro["input_ids"]).logits[:, :-1].float()
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), micro["input_ids"][:, 1:].flatten(),
                                                 reduction="sum")
        return loss / normalizer, {}

    times: dict[str, list[float]] = {"unsharded": [], "sharded": []}
    for i in range(2 * args.rounds + 2):  # the first two rounds warm up, one per mode
        mode = ("unsharded", "sharded")[i % 2]
        role = Trained(name="actor", model=model, optimizer=optimizer, scheduler=scheduler, plan=update,
                       loss_agg_mode="token-mean", grad_clip=1e9, world_size=world, device=device,
                       sharded_grads=mode == "sharded")
        calls = [0]
        torch.distributed.barrier()
        start = time.perf_counter()
        size = MicroSize("update_actor", key, rows)
        run_update(role, batch, loss_fn, lambda attempt, reset=None, size=size: attempt(size))
        torch.distributed.barrier()
        if i >= 2:
            times[mode].append(time.perf_counter() - start)
    if rank == 0:
        torch.save({"times": times, "held": held,
                    "params": sum(p.numel() for p in model.parameters())}, out)
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4, help="timed updates per mode")
    parser.add_argument("--micro", type=int, default=4, help="micro-batches per mini-batch")
    parser.add_argument("--rows", type=int, default=8, help="rows per rank")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()
    if args.rows % args.micro:
        parser.error(f"--micro={args.micro} must divide --rows={args.rows}")
    out = f"/tmp/grad_accumulation_{free_port()}.pt"
    mp.spawn(_rank, args=(2, free_port(), args, out), nprocs=2)
    r = torch.load(out)
    med = {mode: statistics.median(t) for mode, t in r["times"].items()}
    print(f"2 gloo ranks, {r['params'] / 1e6:.1f}M parameters, {args.rows} rows x {SEQ} tokens per rank, "
          f"{args.micro} micro-batches, {args.threads} thread(s) per rank")
    for mode in ("unsharded", "sharded"):
        times = " ".join(f"{t:.3f}" for t in r["times"][mode])
        print(f"{mode:<10} update {med[mode]:.3f} s (median; {times}); gradients held at micro-batch 2: "
              f"{r['held'][mode] / 2**20:.1f} MB")
    print(f"ratio sharded / unsharded: {med['sharded'] / med['unsharded']:.3f} (time), "
          f"{r['held']['sharded'] / r['held']['unsharded']:.3f} (gradient bytes)")


if __name__ == "__main__":
    main()
