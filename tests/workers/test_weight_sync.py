"""Weight sync in buckets: the memory a sync adds is about one bucket, never the whole model.

Two FSDP2 ranks over gloo, so `full_tensor()` really all-gathers into new memory, on a 13.3 MiB
model. Rank 0 streams its actor into an HF engine that holds its own copy (so every tensor is
really copied), under PeakTracker (logicrl/memory/tracker.py), which counts every CPU allocation
c10 makes: the peak of live tensor bytes above the start is the sync's extra memory.
"""

import pytest
import torch
import transformers

from logicrl.controller.ports import free_port
from tests.helpers.spawn import spawn
from tests.workers.conftest import leave_group

pytestmark = pytest.mark.integration

MIB = 2**20
# head_dim 64 as vLLM's CPU attention needs; 4 layers so no single layer is most of the model.
CONFIG = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
              intermediate_size=704, vocab_size=2048, tie_word_embeddings=True)


def build(seed: int):
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(transformers.Qwen2Config(**CONFIG))


def _rank(rank: int, world: int, port: int, out: str):
    from logicrl.memory.tracker import PeakTracker
    from logicrl.workers.fsdp import init_distributed, iter_full_params, shard_model
    from logicrl.workers.rollout.hf import HFRolloutEngine
    from logicrl.workers.weight_sync import iter_engine_weights

    torch.set_num_threads(1)
    device = torch.device("cpu")
    actor = shard_model(build(seed=0), init_distributed(rank, world, "127.0.0.1", port, device), device)
    engine = HFRolloutEngine(build(seed=1).eval(), pad_id=0, eos_ids=[], micro_batch_size=1)
    results = {}
    for bucket_mb in (1.0, 1000.0):  # a bucket smaller than one MLP pair; a bucket bigger than the model
        stats: dict = {}
        with PeakTracker("cpu") as tracker:
            engine.sync_weights(iter_engine_weights(actor, bucket_mb, stats))
        results[bucket_mb] = dict(extra=tracker.peak_bytes - tracker.start_bytes, **stats)
    full = dict(iter_full_params(actor))
    synced = all(torch.equal(p, full[n]) for n, p in engine.model.named_parameters())
    if rank == 0:
        sizes = [p.numel() * p.element_size() for p in full.values()]
        torch.save(dict(results=results, synced=synced, model_bytes=sum(sizes), largest=max(sizes)), out)
    leave_group()


def test_sync_peak_is_one_bucket_not_the_model(tmp_path):
    out = str(tmp_path / "sync.pt")
    spawn(_rank, args=(2, free_port(), out), nprocs=2)
    r = torch.load(out)
    small, whole = r["results"][1.0], r["results"][1000.0]
    assert r["synced"]  # the engine ended with the actor's weights
    assert r["model_bytes"] > 12 * MIB and r["largest"] == 2 * MIB  # the [2048, 256] embedding
    # The stream's own account: buckets of <= 1 MiB, except the embedding alone in its own.
    assert small["peak_bucket_bytes"] == r["largest"] and small["buckets"] > 10
    assert whole["peak_bucket_bytes"] == r["model_bytes"] and whole["buckets"] == 1
    # Measured: the bucket held (here the 2 MiB embedding alone) plus, for a moment, a second copy
    # of the tensor being gathered (full_tensor over gloo: 2 MiB more for the embedding)...
    assert small["extra"] <= small["peak_bucket_bytes"] + r["largest"] + 64 * 1024, small
    assert small["extra"] * 3 < r["model_bytes"]
    # ...while one bucket holding everything shows the whole model (plus one such copy), so the
    # tracker does see gathered memory.
    assert r["model_bytes"] < whole["extra"] <= r["model_bytes"] + r["largest"] + 64 * 1024, whole
