"""Offload on CPU ranks: gathers move a host shard to the rank's device first, the grad norm is
reduced on the device and agrees with torch's, optimizer_offload parks AdamW's states on the host
between updates, and each rank finds its own GPU. The CUDA half is tests/workers/test_offload_gpu.py.
"""

from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from logicrl.controller.ports import free_port
from logicrl.workers import fsdp
from logicrl.workers.devices import gpu_index
from logicrl.workers.fsdp import full_tensor, load_optimizer, offload_optimizer
from tests.helpers.spawn import spawn
from tests.workers.conftest import leave_group


class FakeShard:
    """Duck-types a DTensor shard: records what is done to it, in order."""

    def __init__(self, device: str, mesh_type: str, log: list):
        self.device, self.device_mesh, self.log = torch.device(device), SimpleNamespace(device_type=mesh_type), log

    def to(self, device):
        self.log.append(("to", str(device)))
        return FakeShard(str(device), self.device_mesh.device_type, self.log)

    def full_tensor(self):
        self.log.append(("gather on", str(self.device)))
        return self


def test_a_host_shard_of_a_cuda_mesh_is_moved_to_the_device_before_the_gather(monkeypatch):
    log = []
    full_tensor(FakeShard("cpu", "cuda", log), torch.device("cuda", 1))
    assert log == [("to", "cuda:1"), ("gather on", "cuda:1")]
    # Without a device given, the rank's current device of the mesh's type (init_distributed set it).
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    log.clear()
    full_tensor(FakeShard("cpu", "cuda", log))
    assert log == [("to", "cuda:3"), ("gather on", "cuda:3")]


def test_shards_already_in_place_are_gathered_where_they_are():
    log = []
    full_tensor(FakeShard("cpu", "cpu", log))  # a CPU rank: gloo gathers host shards
    full_tensor(FakeShard("cuda:0", "cuda", log), torch.device("cuda", 0))  # no param_offload
    assert log == [("gather on", "cpu"), ("gather on", "cuda:0")]
    plain = torch.ones(2)
    assert full_tensor(plain, torch.device("meta")) is plain  # not a shard: left alone


@pytest.fixture(scope="module")
def one_rank():
    return fsdp.init_distributed(0, 1, "127.0.0.1", free_port(), torch.device("cpu"))


def test_a_real_fsdp2_shard_is_gathered_on_the_given_device(one_rank):
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(torch.nn.Linear(4, 3), mesh=one_rank)
    assert model.weight.device.type == "cpu"
    # "meta" stands in for the GPU this machine lacks: the gather's result is on it, so the shard
    # went there first (gathering on the host and moving after would return a CPU tensor).
    out = full_tensor(model.weight, torch.device("meta"))
    assert out.device.type == "meta" and out.shape == (3, 4) and not hasattr(out, "full_tensor")


# ---------------------------------------------------------------- clip_grad_norm on 2 gloo ranks
def _clip_rank(rank: int, world: int, port: int, out: str):
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    mesh = fsdp.init_distributed(rank, world, "127.0.0.1", port, torch.device("cpu"))
    torch.manual_seed(0)
    # Odd first dims (5, 3) over 2 ranks: FSDP2 pads the last shard, which the norm must not count.
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(1)).chunk(world)[rank]
    (model(x) ** 2).sum().backward()
    before = [p.grad.full_tensor().clone() for p in model.parameters()]
    norm = fsdp.clip_grad_norm(model, max_norm=0.5, device=torch.device("cpu"))
    after = [p.grad.full_tensor().clone() for p in model.parameters()]
    if rank == 0:
        torch.save({"norm": norm, "before": before, "after": after}, out)
    leave_group()


@pytest.mark.integration
def test_clip_grad_norm_agrees_with_torch_on_two_gloo_ranks(tmp_path):
    out = str(tmp_path / "clip.pt")
    spawn(_clip_rank, args=(2, free_port(), out), nprocs=2)
    got = torch.load(out)
    # torch's own clip on plain tensors holding the same (gathered, averaged) gradients.
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in got["before"]]
    for p, g in zip(params, got["before"]):
        p.grad = g.clone()
    expected = torch.nn.utils.clip_grad_norm_(params, 0.5)
    assert float(expected) > 0.5  # the clip is active, so the scaled gradients are compared too
    assert got["norm"] == pytest.approx(float(expected), rel=1e-6)
    for p, clipped in zip(params, got["after"]):
        torch.testing.assert_close(clipped, p.grad, rtol=1e-6, atol=1e-8)


# ---------------------------------------------------------------- optimizer_offload
def test_load_brings_states_to_their_parameters_device_and_leaves_step():
    param = torch.nn.Parameter(torch.empty(3, device="meta"))  # "meta" stands in for the GPU
    optimizer = torch.optim.AdamW([param])
    optimizer.state[param] = {"step": torch.tensor(4.0), "exp_avg": torch.ones(3), "exp_avg_sq": torch.ones(3)}
    load_optimizer(optimizer)
    state = optimizer.state[param]
    assert state["exp_avg"].device.type == state["exp_avg_sq"].device.type == "meta"
    assert state["step"].device.type == "cpu"  # torch keeps a non-fused AdamW's step on the host


def _trained(mesh, optimizer_offload: bool):
    from logicrl.config.plan import Micro, Update
    from logicrl.workers.update import Trained

    torch.manual_seed(0)
    model = fsdp.shard_model(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)), mesh,
                             torch.device("cpu"))
    optimizer, scheduler = fsdp.build_optimizer(model, 1e-2, 0.0, 10, 0.0, "constant")
    micro = Micro("ppo_micro_batch_size_per_gpu", 2, False)
    update = Update(mini_prompts=4, per_rank_mini=4, micro=micro, ppo_epochs=1, num_mini=1)
    return Trained(name="actor", model=model, optimizer=optimizer, scheduler=scheduler, plan=update,
                   loss_agg_mode="token-mean", grad_clip=1.0, world_size=1, device=torch.device("cpu"),
                   optimizer_offload=optimizer_offload)


def _update(role, events: list | None = None):
    from logicrl.workers.oom import MicroSize
    from logicrl.workers.update import run_update

    batch = TensorDict({"x": torch.arange(16.0).reshape(4, 4) / 16, "response_mask": torch.ones(4, 1)},
                       batch_size=[4])

    def loss_fn(micro, normalizer):
        if events is not None:
            events.append("forward")
        return role.model(micro["x"]).pow(2).sum() / normalizer, {}

    size = MicroSize("update_actor", role.plan.micro.key, role.plan.micro.value)
    return run_update(role, batch, loss_fn, lambda attempt, reset=None: attempt(size))


@pytest.mark.parametrize("offload", [True, False])
def test_optimizer_offload_loads_for_the_update_and_parks_after(one_rank, monkeypatch, offload):
    from logicrl.workers import update as update_module

    role = _trained(one_rank, offload)
    events = []
    monkeypatch.setattr(update_module, "load_optimizer", lambda opt: events.append("load") or load_optimizer(opt))
    monkeypatch.setattr(update_module, "offload_optimizer",
                        lambda opt: events.append("offload") or offload_optimizer(opt))
    role.optimizer.register_step_post_hook(lambda *_: events.append("step"))
    for _ in range(2):
        _update(role, events)
    one = ["forward", "forward", "step"]  # 4 rows in micro-batches of 2, one optimizer step
    assert events == (["load", *one, "offload"] * 2 if offload else one * 2)
    states = [v for s in role.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert len(states) == 2 * 4 and all(t.device.type == "cpu" for t in states)  # exp_avg(_sq) of 4 tensors


def test_optimizer_offload_changes_no_number(one_rank):
    on, off = _trained(one_rank, True), _trained(one_rank, False)
    for _ in range(3):
        _update(on), _update(off)
    for (name, a), (_, b) in zip(fsdp.iter_full_params(on.model), fsdp.iter_full_params(off.model)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


# ---------------------------------------------------------------- which GPU a rank takes
def test_a_rank_takes_the_gpu_ray_assigned_it():
    assert gpu_index(5, 1, [3], "3") == 0  # Ray narrowed CUDA_VISIBLE_DEVICES to the rank's GPU
    # RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES: every rank sees all GPUs; the assigned one counts.
    assert gpu_index(5, 8, ["3"], "0,1,2,3,4,5,6,7") == 3
    assert gpu_index(0, 4, ["6"], "4, 5, 6, 7") == 2  # a node whose job was given GPUs 4-7
    assert gpu_index(0, 8, [6], None) == 6  # nothing set: Ray's ids are the physical order
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES=0,1 hides it"):
        gpu_index(0, 2, ["5"], "0,1")


def test_without_ray_the_one_visible_gpu_or_one_per_rank():
    assert gpu_index(3, 1, [], "2") == 0
    assert gpu_index(3, 2, [], None) == 1
