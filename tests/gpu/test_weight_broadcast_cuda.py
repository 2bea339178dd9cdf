"""The weight broadcast between groups over NCCL (workers/collective.py): a Qwen2.5-0.5B-shaped bf16 state
(random values) from a trainer root on cuda:0 to a rollout rank on cuda:1, in 512 MiB buckets, timed, and the
receiver's digest equal to the sender's. Needs two CUDA devices (a lent one-GPU machine skips it, and says so);
the two ranks are spawned processes, as the two groups' ranks are."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from tests.gpu.runs import QWEN25_05B

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices (one per group)")]
BUCKET_MB = 512


def qwen_shapes(c: dict = QWEN25_05B) -> list[tuple[str, tuple[int, ...]]]:
    """The names and shapes of a Qwen2 state as the engine takes it (a tied head: no lm_head.weight)."""
    h, kv, inter = c["hidden_size"], c["num_key_value_heads"] * c["head_dim"], c["intermediate_size"]
    shapes = [("model.embed_tokens.weight", (c["vocab_size"], h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.q_proj.bias", (h,)),
                   (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.k_proj.bias", (kv,)),
                   (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.v_proj.bias", (kv,)),
                   (p + "self_attn.o_proj.weight", (h, h)), (p + "mlp.gate_proj.weight", (inter, h)),
                   (p + "mlp.up_proj.weight", (inter, h)), (p + "mlp.down_proj.weight", (h, inter)),
                   (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    return shapes + [("model.norm.weight", (h,))]


class Received:
    def sync_weights(self, tensors):
        for _ in tensors:  # the digest is taken as each tensor goes by
            pass


def _rank(rank: int, port: int, out: str) -> None:
    from logicrl.workers.collective import BroadcastReceiver, BroadcastSender, WeightGroup
    from logicrl.workers.transport import Payload, TensorMeta

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    meta = [TensorMeta(name, shape, torch.bfloat16) for name, shape in qwen_shapes()]
    group = WeightGroup.join("127.0.0.1", port, rank, 2, device, timeout_s=120)
    side = BroadcastSender(BUCKET_MB) if rank == 0 else BroadcastReceiver()
    side.group = group
    side.describe("weights", meta)
    gen = torch.Generator(device=device).manual_seed(0)
    times = []
    for version in (1, 2):  # the first includes NCCL's communicator start-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        if rank == 0:
            tensors = ((m.name, torch.randn(m.shape, generator=gen, device=device, dtype=m.dtype)) for m in meta)
            receipt = side.send(Payload("weights", version, tensors))
        else:
            receipt = side.receive(Received())
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    Path(out, f"rank{rank}.json").write_text(json.dumps({"checksum": receipt.checksum, "bytes": receipt.bytes,
                                                         "seconds": times, "version": receipt.version}))


def test_nccl_broadcast_of_a_05b_state_arrives_whole_and_checked(tmp_path):
    from logicrl.controller.ports import free_port

    port = free_port("127.0.0.1")
    mp.spawn(_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    sent, got = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert got["checksum"] == sent["checksum"] and got["bytes"] == sent["bytes"] and got["version"] == 2
    assert sent["bytes"] == sum(torch.Size(s).numel() for _, s in qwen_shapes()) * 2  # bf16: ~0.99 GB
    print(f"NCCL broadcast of {sent['bytes'] / 2**30:.2f} GiB in {BUCKET_MB} MiB buckets: first "
          f"{sent['seconds'][0]:.2f} s, then {sent['seconds'][1]:.2f} s (sender, digest included), "
          f"{got['seconds'][1]:.2f} s (receiver)")
    assert sent["seconds"][1] < 60
