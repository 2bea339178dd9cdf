"""Meta-device loading (workers/sharded_load.py) on two gloo ranks gives every rank exactly the
shards a full load then shard gives, while rank 1 never reads the checkpoint.

One spawn, three models of the embedded tiny model (tied embeddings): the policy with fp32 masters
sharded under a bf16 MixedPrecisionPolicy, the critic (its fresh value head comes from rank 0's
seeded init), and the policy with a LoRA adapter. Each rank compares its own shards, and the RoPE
buffers, with those of the plain path; then the bf16 weight sync of the mixed-precision policy,
cast shard by shard before the gather, against the full fp32 weights cast after.
"""

import pytest
import torch

from logicrl.controller.ports import free_port
from tests.helpers.spawn import spawn
from tests.workers.conftest import leave_group

pytestmark = pytest.mark.integration
WORLD = 2
TINY = "embedded:tiny"


def _local(model) -> dict[str, torch.Tensor]:
    state = {f"param/{n}": p.detach().to_local().clone() for n, p in model.named_parameters()}
    state.update({f"buffer/{n}": b.detach().clone() for n, b in model.named_buffers()})
    return state


def _rank(rank: int, port: int, out: str):
    import transformers

    from logicrl.models.loading import LoraSpec, load_causal_lm, load_value_model
    from logicrl.workers.fsdp import init_distributed, iter_full_params, shard_model
    from logicrl.workers.sharded_load import load_sharded_model
    from logicrl.workers.weight_sync import iter_engine_weights

    torch.set_num_threads(1)
    device = torch.device("cpu")
    mesh = init_distributed(rank, WORLD, "127.0.0.1", port, device)
    lora = LoraSpec(4, 8.0, ["q_proj", "v_proj"])
    builds = {
        "policy": (lambda meta: load_causal_lm(TINY, torch.float32, on_meta=meta), torch.bfloat16),
        "critic": (lambda meta: load_value_model(TINY, torch.float32, on_meta=meta), torch.bfloat16),
        "lora": (lambda meta: load_causal_lm(TINY, torch.bfloat16, lora=lora, on_meta=meta), None),
    }
    results = {}
    for name, (build, compute) in builds.items():
        torch.manual_seed(7)  # the critic's head and LoRA's A are drawn from the seed in both paths
        plain = shard_model(build(False), mesh, device, compute_dtype=compute)
        if rank == 1:  # a meta load must not read the checkpoint on rank 1
            real = transformers.PreTrainedModel.__dict__["from_pretrained"]  # the classmethod itself
            transformers.PreTrainedModel.from_pretrained = classmethod(
                lambda *a, **k: (_ for _ in ()).throw(AssertionError("rank 1 read the checkpoint")))
        torch.manual_seed(7)
        try:
            meta = load_sharded_model(build, mesh, device, compute_dtype=compute)
        finally:
            if rank == 1:
                transformers.PreTrainedModel.from_pretrained = real
        expected, got = _local(plain), _local(meta)
        results[name] = dict(keys=expected.keys() == got.keys(), equal=[k for k in expected
                                                                         if not torch.equal(expected[k], got[k])],
                             dtypes={str(p.dtype) for p in meta.parameters()},
                             tied=name != "critic" and
                             meta.get_output_embeddings().weight is meta.get_input_embeddings().weight)
        if name == "policy":
            full = dict(iter_full_params(meta))
            synced = dict(iter_engine_weights(meta, 1.0, dtype=torch.bfloat16))
            results["sync"] = all(synced[k].dtype == torch.bfloat16 and torch.equal(synced[k], full[k].bfloat16())
                                  for k in full) and synced.keys() == full.keys()
    torch.save(results, f"{out}/rank{rank}.pt")
    leave_group()


def test_meta_load_gives_the_full_loads_shards_without_reading_on_rank_1(tmp_path):
    spawn(_rank, args=(free_port(), str(tmp_path)), nprocs=WORLD)
    for rank in range(WORLD):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        for name in ("policy", "critic", "lora"):
            r = results[name]
            assert r["keys"] and r["equal"] == [], (rank, name, r["equal"])
        assert results["policy"]["dtypes"] == {"torch.float32"}
        assert results["policy"]["tied"] and results["lora"]["tied"]
        assert results["lora"]["dtypes"] == {"torch.bfloat16", "torch.float32"}  # frozen base, fp32 adapters
        assert results["sync"]
