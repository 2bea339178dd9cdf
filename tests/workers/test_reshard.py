"""A forward-only pass leaves FSDP2's root gathered; fsdp.reshard puts it back to shards (2 gloo ranks)."""

import pytest
import torch

from logicrl.controller.ports import free_port
from tests.helpers.spawn import spawn
from tests.workers.conftest import leave_group

pytestmark = pytest.mark.integration


def _root_local_shape(model) -> tuple[int, ...]:
    # Sharded, the embedding is a DTensor whose local part holds half the [2048, 128] rows; gathered,
    # FSDP2 swaps in the plain full tensor.
    weight = model.model.embed_tokens.weight
    return tuple((weight.to_local() if hasattr(weight, "to_local") else weight).shape)


def _rank(rank: int, port: int, out: str):
    from logicrl.workers.fsdp import init_distributed, reshard, shard_model
    from tests.workers.conftest import build_tiny_qwen2

    torch.set_num_threads(1)
    mesh = init_distributed(rank, 2, "127.0.0.1", port, torch.device("cpu"))
    model = shard_model(build_tiny_qwen2(seed=0), mesh, torch.device("cpu"))
    shapes = {"before": _root_local_shape(model)}
    with torch.no_grad():
        model(input_ids=torch.randint(3, 2048, (2, 6)))
    shapes["after forward"] = _root_local_shape(model)
    layer = model.model.layers[0].mlp.up_proj.weight  # layers reshard after their forward anyway
    shapes["layer after forward"] = tuple(layer.to_local().shape)
    reshard(model)
    shapes["after reshard"] = _root_local_shape(model)
    if rank == 0:
        torch.save(shapes, out)
    leave_group()


def test_forward_only_pass_then_reshard_leaves_only_shards(tmp_path):
    out = str(tmp_path / "shapes.pt")
    spawn(_rank, args=(free_port(), out), nprocs=2)
    shapes = torch.load(out)
    assert shapes["before"] == (1024, 128)  # 2048 rows over 2 ranks
    assert shapes["after forward"] == (2048, 128)  # what the worker's forward-only phases left behind
    assert shapes["layer after forward"] == (176, 128)  # up_proj [352, 128], halved
    assert shapes["after reshard"] == (1024, 128)
