"""Offload on a real GPU (one rank): the process group's two backends, param_offload's gathers and
grad norm on the device, optimizer_offload's memory between updates.

Each test runs in a spawned process: the process group and CUDA state stay out of pytest's.
Imports are torch-only (logicrl.workers.fsdp), except where marked: the GPU check machine has
neither Ray nor Hydra.
"""

import pytest
import torch
import torch.multiprocessing as mp

from logicrl.controller.ports import free_port

pytestmark = pytest.mark.gpu
MB = 2**20


def spawn(fn, tmp_path, *args) -> dict:
    out = str(tmp_path / f"{fn.__name__}.pt")
    mp.spawn(fn, args=(free_port(), out, *args), nprocs=1)
    return torch.load(out)


def model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Tanh(), torch.nn.Linear(1024, 256))


def shard(net, mesh, device, param_offload: bool):
    from logicrl.workers.fsdp import shard_model

    return shard_model(net, mesh, device, param_offload=param_offload)


def _param_offload(rank: int, port: int, out: str):
    import torch.distributed as dist

    from logicrl.workers.fsdp import clip_grad_norm, full_tensor, init_distributed, iter_full_params

    device = torch.device("cuda", 0)
    mesh = init_distributed(rank, 1, "127.0.0.1", port, device)
    group = dist.group.WORLD
    dist.all_reduce(torch.ones(1))  # host tensor: the gloo half of the group
    dist.all_reduce(torch.ones(1, device=device))  # device tensor: NCCL
    reference = model()
    expected = {name: p.detach().clone() for name, p in reference.named_parameters()}
    net = shard(model(), mesh, device, param_offload=True)
    shard_devices = {p.device.type for p in net.parameters()}
    gathered = dict(iter_full_params(net))
    x = torch.randn(64, 512, device=device)
    net(x).pow(2).sum().backward()
    grad_devices = {p.grad.device.type for p in net.parameters()}
    grads = [full_tensor(p.grad).clone() for p in net.parameters()]
    norm = clip_grad_norm(net, max_norm=0.5, device=device)
    clipped = [full_tensor(p.grad).clone() for p in net.parameters()]
    torch.save({"bound": str(group.bound_device_id), "shard_devices": shard_devices, "grad_devices": grad_devices,
                "gathered_devices": {t.device.type for t in gathered.values()},
                "gathered": {k: t.cpu() for k, t in gathered.items()}, "expected": expected,
                "norm": norm, "grads": [g.cpu() for g in grads], "clipped": [g.cpu() for g in clipped]}, out)
    dist.destroy_process_group()


def test_param_offload_gathers_and_clips_on_the_device(tmp_path):
    got = spawn(_param_offload, tmp_path)
    assert got["bound"] == "cuda:0"
    assert got["shard_devices"] == {"cpu"} and got["grad_devices"] == {"cpu"}  # CPUOffloadPolicy
    assert got["gathered_devices"] == {"cuda"}  # moved, then gathered on the GPU
    for name, tensor in got["expected"].items():
        torch.testing.assert_close(got["gathered"][name], tensor.to(got["gathered"][name].dtype), rtol=0, atol=0)
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in got["grads"]]
    for p, g in zip(params, got["grads"]):
        p.grad = g.clone()
    expected = torch.nn.utils.clip_grad_norm_(params, 0.5)
    assert float(expected) > 0.5 and got["norm"] == pytest.approx(float(expected), rel=1e-5)
    for p, clipped in zip(params, got["clipped"]):
        torch.testing.assert_close(clipped, p.grad, rtol=1e-5, atol=1e-7)


def _optimizer_offload(rank: int, port: int, out: str):
    import torch.distributed as dist

    from logicrl.workers.fsdp import init_distributed, iter_full_params, load_optimizer, offload_optimizer

    device = torch.device("cuda", 0)
    mesh = init_distributed(rank, 1, "127.0.0.1", port, device)
    nets = [shard(model(), mesh, device, param_offload=False) for _ in range(2)]
    optimizers = [torch.optim.AdamW(n.parameters(), lr=1e-3) for n in nets]
    x = torch.randn(64, 512, device=device)
    state_bytes = 2 * sum(p.numel() * p.element_size() for p in nets[0].parameters())
    drops = []
    for _ in range(3):
        for i, (net, opt) in enumerate(zip(nets, optimizers)):
            offloaded = i == 0
            if offloaded:
                load_optimizer(opt)
            net(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if offloaded:
                torch.cuda.synchronize()
                before = torch.cuda.memory_allocated(device)
                offload_optimizer(opt)
                drops.append(before - torch.cuda.memory_allocated(device))
    devices = {v.device.type for s in optimizers[0].state.values() for k, v in s.items() if k != "step"}
    same = all(torch.equal(a, b) for (_, a), (_, b) in zip(iter_full_params(nets[0]), iter_full_params(nets[1])))
    torch.save({"drops": drops, "state_bytes": state_bytes, "devices": devices, "same": same}, out)
    dist.destroy_process_group()


def test_optimizer_offload_frees_the_states_between_updates_and_changes_no_number(tmp_path):
    got = spawn(_optimizer_offload, tmp_path)
    assert got["devices"] == {"cpu"}
    # Every update's end gives back exactly exp_avg + exp_avg_sq (sizes are multiples of 512 B).
    assert got["drops"] == [got["state_bytes"]] * 3
    assert got["same"]  # bit-identical to the twin whose states never left the GPU


def _update_path(rank: int, port: int, out: str):
    """The real update loop (workers/update.py) with optimizer_offload; needs Hydra's config package."""
    import gc

    import torch.distributed as dist
    from tensordict import TensorDict

    from logicrl.config.plan import Micro, Update
    from logicrl.workers.fsdp import build_optimizer, init_distributed
    from logicrl.workers.oom import MicroSize
    from logicrl.workers.update import Trained, run_update

    device = torch.device("cuda", 0)
    mesh = init_distributed(rank, 1, "127.0.0.1", port, device)
    after = {}
    for offload in (False, True):
        net = shard(model(), mesh, device, param_offload=False)
        optimizer, scheduler = build_optimizer(net, 1e-3, 0.0, 10, 0.0, "constant")
        micro = Micro("ppo_micro_batch_size_per_gpu", 8, False)
        role = Trained(name="actor", model=net, optimizer=optimizer, scheduler=scheduler,
                       plan=Update(16, 16, micro, 1, 1), loss_agg_mode="token-mean", grad_clip=1.0, world_size=1,
                       device=device, optimizer_offload=offload)
        batch = TensorDict({"x": torch.randn(16, 512, device=device),
                            "response_mask": torch.ones(16, 1, device=device)}, batch_size=[16])
        size = MicroSize("update_actor", micro.key, 8)
        def loss_fn(mb, n, net=net):  # this pass's net, bound before the `del` below
            return net(mb["x"]).pow(2).sum() / n, {}

        run_update(role, batch, loss_fn, lambda fn, reset=None, size=size: fn(size))
        torch.cuda.synchronize()
        after[offload] = torch.cuda.memory_allocated(device)
        del net, optimizer, scheduler, role
        # FSDP2's hooks hold the module in reference cycles: without a collection the first net's parameters
        # outlive it and were counted in the offload case (H200, torch 2.11: exactly one parameter set short).
        gc.collect()
    state_bytes = 2 * sum(p.numel() * 4 for p in model().parameters())
    torch.save({"after": after, "state_bytes": state_bytes}, out)
    dist.destroy_process_group()


def test_the_update_loop_leaves_the_states_on_the_host(tmp_path):
    pytest.importorskip("hydra")  # logicrl.config imports it
    pytest.importorskip("tensordict")
    got = spawn(_update_path, tmp_path)
    assert got["after"][False] - got["after"][True] == got["state_bytes"]
