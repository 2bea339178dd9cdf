"""A curriculum stage starts from the previous stage's weights, with or without its Adam moments."""

import pytest
import torch

from logicrl.controller.ports import free_port
from logicrl.workers.checkpoint import load_stage_start, save_sharded
from logicrl.workers.fsdp import build_optimizer, init_distributed, iter_full_params, shard_model
from tests.workers.conftest import build_tiny_qwen2


def build(seed: int, lr: float):
    device = torch.device("cpu")
    mesh = init_distributed(0, 1, "127.0.0.1", free_port(), device)
    model = shard_model(build_tiny_qwen2(seed=seed), mesh, device)
    optimizer, scheduler = build_optimizer(model, lr, 0.0, 10, 0.0, "constant")
    return model, optimizer, scheduler


def full(model) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in iter_full_params(model)}


@pytest.fixture(scope="module")
def previous_stage(tmp_path_factory):
    model, optimizer, scheduler = build(seed=0, lr=1e-3)
    ids = torch.randint(0, 2048, (2, 10), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    directory = tmp_path_factory.mktemp("stage1") / "actor"
    save_sharded(directory, model, optimizer, scheduler)
    moments = {name: optimizer.state[p]["exp_avg"].full_tensor().clone() for name, p in model.named_parameters()}
    return directory, full(model), moments


@pytest.mark.parametrize("carry", [False, True])
def test_stage_start_takes_weights_and_optionally_the_optimizer(previous_stage, carry):
    directory, weights, moments = previous_stage
    model, optimizer, scheduler = build(seed=1, lr=5e-2)  # another init, another lr
    load_stage_start(directory, model, optimizer, scheduler, carry_optimizer=carry)
    for name, tensor in full(model).items():
        torch.testing.assert_close(tensor, weights[name], rtol=0, atol=0)
    assert [g["lr"] for g in optimizer.param_groups] == [5e-2]  # this stage's schedule, not the saved 1e-3
    if carry:
        for name, p in model.named_parameters():
            torch.testing.assert_close(optimizer.state[p]["exp_avg"].full_tensor(), moments[name], rtol=0, atol=0)
    else:
        assert not optimizer.state  # fresh Adam moments
