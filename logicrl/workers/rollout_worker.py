"""A rank of the rollout group (`actor_rollout_ref.hybrid_engine=false`): the engine and nothing else.

No FSDP model, no optimizer: it generates its shard of each batch exactly as a colocated rank does (the
colocated worker's `generate`, workers/hybrid.py), stamps every row with the version of the weights that
generated it (`weight_version`), and its `update_weights` receives the trainer's broadcast into the engine
(workers/collective.py). The engine never sleeps here: nothing else wants its memory, and a level-2 sleep
would drop weights only the trainer can resend.
"""

from __future__ import annotations

import time

import torch
from tensordict import TensorDict

from logicrl.config.plan import StepPlan
from logicrl.faults import Faults
from logicrl.models.loading import load_tokenizer
from logicrl.workers.build import build_rollout
from logicrl.workers.collective import BroadcastReceiver, WeightGroup
from logicrl.workers.hybrid import HybridWorker
from logicrl.workers.phase_worker import worker_phase
from logicrl.workers.transport import TensorMeta


class RolloutWorker(HybridWorker):
    # The model phases need models this rank does not hold.
    without_phases = ("reward_model", "old_log_prob", "ref", "values", "update_critic", "update_actor")

    def __init__(self, config: dict, plan: StepPlan, rank: int, world_size: int, master_addr: str,
                 master_port: int, threads: int | None = None, faults: Faults | None = None,
                 log_file: str | None = None):
        where = self._start_rank(config, plan, rank, world_size, master_addr, master_port, threads, faults, log_file)
        cfg = self.cfg
        cfg.actor_rollout_ref.rollout.free_cache_engine = False  # nothing trains here: the engine keeps its memory
        self.models = None
        self.engine = build_rollout(cfg, plan, load_tokenizer(cfg.actor_rollout_ref.model.path, quiet=True), where)
        self.transport = BroadcastReceiver(cfg.async_training.check_weights)

    def module(self, model: str) -> torch.nn.Module | None:
        return None  # only the engine, which runs no collectives with the other ranks

    def join_weight_group(self, addr: str, port: int, size: int) -> None:
        self.transport.group = WeightGroup.join(addr, port, 1 + self.rank, size, self.device,
                                                self.cfg.async_training.sync_timeout_s)

    def describe_weights(self, meta: dict[str, list[TensorMeta]]) -> None:
        for kind, described in meta.items():
            self.transport.describe(kind, described)

    @worker_phase("generate", retried=True)
    def _generate(self, batch: TensorDict, retry, params: dict):
        out, metrics = HybridWorker._generate(self, batch, retry, params)
        out["weight_version"] = torch.full((len(out),), self.transport.version, dtype=torch.long, device=self.device)
        return out, metrics

    @worker_phase("update_weights", retried=False)
    def _update_weights(self, _batch: None, _retry, version: int | None = None):
        """The trainer's broadcast into the engine: one payload, or the base once and then the adapters."""
        start = time.perf_counter()
        receipts = [self.transport.receive(self.engine)]
        if receipts[0].kind == "base":
            receipts.append(self.transport.receive(self.engine))
        if version is not None and receipts[-1].version != version:
            raise RuntimeError(f"the rollout engine received weights of version {receipts[-1].version}, the "
                               f"controller announced {version}")
        metrics = {"perf/update_weights/received_bytes": float(sum(r.bytes for r in receipts)),
                   "perf/update_weights/receive_seconds": time.perf_counter() - start}
        if receipts[-1].checksum is not None:
            metrics["async/checksum_match"] = 1.0  # a mismatch raised in receive
        return None, metrics
