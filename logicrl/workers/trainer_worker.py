"""A rank of the trainer group (`actor_rollout_ref.hybrid_engine=false`): the FSDP2 models, no engine.

It runs the colocated worker's model phases (workers/hybrid.py) unchanged, less `generate`, and its
`update_weights` streams the actor's weights, bucket by bucket as there, through a broadcast to the rollout
group (workers/collective.py) instead of into an engine of its own: every trainer rank takes part in the
stream's FSDP all-gathers, rank 0 alone broadcasts. Resuming or starting a stage loads the trained state and
sends nothing: the controller syncs when the rollout group is ready to receive (trainer/one_step_off.py).
"""

from __future__ import annotations

import socket
from pathlib import Path

from logicrl.config.plan import StepPlan
from logicrl.faults import Faults
from logicrl.workers import trained_state
from logicrl.workers.build import build_models
from logicrl.workers.collective import BroadcastSender, WeightGroup
from logicrl.workers.hybrid import HybridWorker
from logicrl.workers.transport import TensorMeta
from logicrl.workers.weight_sync import adapter_meta, engine_weight_meta


class TrainerWorker(HybridWorker):
    without_phases = ("generate",)  # the rollout group's

    def __init__(self, config: dict, plan: StepPlan, rank: int, world_size: int, master_addr: str,
                 master_port: int, threads: int | None = None, faults: Faults | None = None,
                 log_file: str | None = None):
        self.master_addr = master_addr
        where = self._start_rank(config, plan, rank, world_size, master_addr, master_port, threads, faults, log_file)
        cfg = self.cfg
        arr = cfg.actor_rollout_ref
        self.remove_padding = arr.model.use_remove_padding
        self.lora = arr.model.lora_rank > 0
        self.models = build_models(cfg, plan, where)
        self.sp = self.models.sp
        self.engine = None  # on the rollout group
        self.transport = BroadcastSender(arr.rollout.update_weights_bucket_mb, cfg.async_training.check_weights)
        self.adapters_only = self.lora and arr.rollout.lora_sync == "adapters"
        self.transport.describe("weights", engine_weight_meta(self.actor.model, self.dtype))
        if self.adapters_only:
            self.transport.describe("adapters", adapter_meta(self.actor.model, self.dtype))
        # Over a 4-bit base the rollout engines loaded the checkpoint's own weights: the first adapter sync
        # sends them the dequantized base once (workers/hybrid.py says why).
        self.engine_has_base = not self.models.quantized_base
        self.first_sync = None

    # ---------------------------------------------------------------- the weight group (rank 0 only)
    def weight_group_address(self) -> tuple[str, int]:
        """Where the weight group meets: this rank's node (the trainer group's rendezvous address), a free port."""
        with socket.socket() as s:  # controller/ports.py's free_port, on this rank's node
            s.bind((self.master_addr, 0))
            return self.master_addr, s.getsockname()[1]

    def join_weight_group(self, addr: str, port: int, size: int) -> None:
        if self.rank == 0:
            self.transport.group = WeightGroup.join(addr, port, 0, size, self.device,
                                                    self.cfg.async_training.sync_timeout_s)

    def weight_meta(self) -> dict[str, list[TensorMeta]]:
        """The names, shapes and dtypes of each payload kind, for the rollout ranks (sent once)."""
        return dict(self.transport.meta)

    # ---------------------------------------------------------------- checkpoints: load, send nothing
    def resume_from(self, directory: str) -> None:
        trained_state.resume(self.models, Path(directory))

    def start_from(self, directory: str, carry_optimizer: bool) -> None:
        trained_state.start_stage(self.models, Path(directory), carry_optimizer)
