"""The actor's update on FSDP2 CPU ranks over gloo, spawned: `run(world, tmp_path, *scenarios)` returns, for
each scenario, rank 0's metrics and full parameters after one update of `make_batch()` split over `world`
ranks. One spawn serves all of a test module's scenarios (a rank's start, torch and transformers, costs
more than its update): each scenario builds its own model and optimizer from the same seed in the same
process group. Shared by tests/workers/test_actor_dp.py, test_micro_oom.py, test_nonfinite_ranks.py and
test_oom_ranks.py."""

from dataclasses import dataclass, field

import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from logicrl.controller.ports import free_port
from tests.helpers.spawn import spawn

ACTOR_CFG = dict(use_dynamic_bsz=False, ppo_micro_batch_size_per_gpu=2, ppo_max_token_len_per_gpu=64, ppo_epochs=1,
                 loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, tau_pos=1.0,
                 tau_neg=1.05, policy_loss={"loss_mode": "vanilla", "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0,
                                            "clip_cov_ub": 5.0, "kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1},
                 entropy_coeff=0.01, use_kl_loss=False, grad_clip=1e9)


def make_batch(n: int = 8, prompt: int = 5, response: int = 6) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 2048, (n, prompt + response), generator=g)
    lengths = torch.randint(1, response + 1, (n,), generator=g)  # unequal valid tokens per response
    response_mask = (torch.arange(response)[None] < lengths[:, None]).long()
    attention_mask = torch.cat([torch.ones(n, prompt, dtype=torch.long), response_mask], 1)
    return TensorDict({
        "input_ids": ids, "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt:], "response_mask": response_mask,
        "advantages": torch.randn(n, response, generator=g) * response_mask,
    }, batch_size=[n])


@dataclass(frozen=True)
class Scenario:
    """One update: `overrides` to ACTOR_CFG, a fault (logicrl/faults.py syntax), FSDP2's sharded gradients."""

    overrides: dict = field(default_factory=dict)
    fault: str | None = None
    sharded_grads: bool = False


def _update(rank: int, world: int, mesh, scenario: Scenario) -> dict:
    from logicrl.config.plan import Micro, Update
    from logicrl.faults import Faults, parse
    from logicrl.workers.actor import Actor
    from logicrl.workers.fsdp import build_optimizer, iter_full_params, shard_model
    from logicrl.workers.oom import MicroSize, phase_retry
    from logicrl.workers.update import Trained
    from tests.workers.conftest import build_tiny_qwen2

    device = torch.device("cpu")
    model = shard_model(build_tiny_qwen2(seed=0), mesh, device)
    _, scheduler = build_optimizer(model, 1e-2, 0.0, 10, 0.0, "constant")
    # Plain SGD with lr 1: the step is exactly minus the gradient, so comparing parameters
    # compares gradients (Adam's first step, ~lr * sign(g), would magnify float noise in tiny g).
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    cfg = OmegaConf.create({**ACTOR_CFG, **scenario.overrides})
    shard = make_batch().chunk(world)[rank]
    key = "ppo_max_token_len_per_gpu" if cfg.use_dynamic_bsz else "ppo_micro_batch_size_per_gpu"
    micro = Micro(key, cfg[key], cfg.use_dynamic_bsz)
    size = MicroSize("update_actor", key, micro.value, micro.by_tokens)
    update = Update(mini_prompts=len(shard), per_rank_mini=len(shard), micro=micro, ppo_epochs=1, num_mini=1)
    role = Trained(name="actor", model=model, optimizer=optimizer, scheduler=scheduler, plan=update,
                   loss_agg_mode=cfg.loss_agg_mode, grad_clip=cfg.grad_clip, world_size=world, device=device,
                   sharded_grads=scenario.sharded_grads)
    retry = phase_retry(size, device, Faults(parse(scenario.fault or "")), step=1, rank=rank, sharded=model)
    metrics = Actor(role, cfg, 1.0, remove_padding=cfg.get("remove_padding", False)).update(shard, retry)
    metrics.update({"perf/oom_retries/update_actor": size.retries, "perf/micro_size/update_actor": size.value})
    params = {name: t.clone() for name, t in iter_full_params(model)}
    return {"metrics": metrics, "grad_norm": metrics["actor/grad_norm"], "params": params}


def _rank(rank: int, world: int, port: int, out: str, scenarios: list[Scenario]):
    from logicrl.workers.fsdp import init_distributed
    from tests.workers.conftest import leave_group

    torch.set_num_threads(1)
    mesh = init_distributed(rank, world, "127.0.0.1", port, torch.device("cpu"))
    results = [_update(rank, world, mesh, scenario) for scenario in scenarios]
    if rank == 0:
        torch.save(results, out)
    leave_group()


def run(world: int, tmp_path, *scenarios: Scenario) -> list[dict]:
    """Each scenario's result ({"metrics", "grad_norm", "params"} of rank 0), in order, from one spawn."""
    out = str(tmp_path / f"world{world}-{len(list(tmp_path.iterdir()))}.pt")
    spawn(_rank, args=(world, free_port(), out, list(scenarios)), nprocs=world)
    return torch.load(out, weights_only=False)
