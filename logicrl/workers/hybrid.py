"""One worker per rank: the FSDP2 actor, the reference, the critic and the rollout engine.

This is the hybrid engine of DESIGN.md: every rank generates for its own shard of prompts with
its engine, trains its shard of the actor, and after each update streams the new weights into
its engine. A plain class: tests build it directly; Ray only places it (controller/).

Tensors cross the Ray boundary on CPU; each method moves its batch to the rank's device.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict

from logicrl.config.batching import uses_critic, uses_ref
from logicrl.logs import quiet_worker
from logicrl.memory.telemetry import measure
from logicrl.models.loading import LoraSpec, load_causal_lm, load_tokenizer, load_value_model, resolve_dtype
from logicrl.workers.actor import Actor, forward_logprobs
from logicrl.workers.checkpoint import export_hf, load_sharded, load_stage_start, save_sharded
from logicrl.workers.critic import Critic
from logicrl.workers.fsdp import build_optimizer, init_distributed, shard_model
from logicrl.workers.oom import MicroSize, retry_on_oom
from logicrl.workers.rollout import SamplingParams
from logicrl.workers.rollout.engines import build_engine
from logicrl.workers.weight_sync import iter_engine_weights


def pick_device(kind: str, rank: int) -> torch.device:
    cuda = torch.cuda.is_available()
    if kind == "cuda" and not cuda:
        raise RuntimeError("trainer.device=cuda but CUDA is not available here: use trainer.device=auto or cpu")
    if kind == "cpu" or not cuda:
        return torch.device("cpu")
    # Ray gives each rank one GPU and makes it cuda:0 through CUDA_VISIBLE_DEVICES.
    return torch.device("cuda", 0 if "CUDA_VISIBLE_DEVICES" in os.environ else rank % torch.cuda.device_count())


class HybridWorker:
    def __init__(self, config: dict, rank: int, world_size: int, master_addr: str, master_port: int,
                 total_steps: int, log_file: str | None = None):
        if log_file:  # engine and Ray output to the run's log file, not the console (logicrl/logs.py)
            quiet_worker(log_file, rank)
        cfg: DictConfig = OmegaConf.create(config)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        threads = os.environ.get("LOGICRL_TORCH_THREADS")
        if threads:
            torch.set_num_threads(int(threads))
        self.device = pick_device(cfg.trainer.device, rank)
        self.mesh = init_distributed(rank, world_size, master_addr, master_port, self.device)
        torch.manual_seed(cfg.trainer.seed)
        arr, model_cfg = cfg.actor_rollout_ref, cfg.actor_rollout_ref.model
        self.dtype = resolve_dtype(model_cfg.dtype, self.device)
        self.temperature = arr.rollout.temperature
        tokenizer = load_tokenizer(model_cfg.path)
        self.lora = model_cfg.lora_rank > 0

        lora = LoraSpec(model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.target_modules) if self.lora else None
        actor_model = load_causal_lm(model_cfg.path, self.dtype, model_cfg.enable_gradient_checkpointing, lora)
        shard_model(actor_model, self.mesh, self.device, arr.actor.fsdp_config.param_offload)
        optim = arr.actor.optim
        self.actor = Actor(actor_model, *build_optimizer(actor_model, optim.lr, optim.weight_decay, total_steps,
                                                         optim.lr_warmup_steps_ratio, optim.lr_scheduler_type),
                           arr.actor, self.temperature, self.device, world_size)

        # With LoRA the reference is the actor with its adapter switched off: no second copy.
        self.ref_model = None
        if uses_ref(cfg) and not self.lora:
            self.ref_model = load_causal_lm(model_cfg.path, self.dtype)
            self.ref_model.requires_grad_(False)
            shard_model(self.ref_model, self.mesh, self.device, arr.ref.fsdp_config.param_offload)

        self.critic = None
        if uses_critic(cfg):
            c = cfg.critic
            critic_model = load_value_model(c.model.path, self.dtype, c.model.enable_gradient_checkpointing)
            shard_model(critic_model, self.mesh, self.device, c.fsdp_config.param_offload)
            self.critic = Critic(critic_model, *build_optimizer(critic_model, c.optim.lr, c.optim.weight_decay,
                                                                total_steps, c.optim.lr_warmup_steps_ratio,
                                                                c.optim.lr_scheduler_type),
                                 c, self.device, world_size)

        # The engine holds its own full copy of the policy: generation lengths differ per rank,
        # and a sharded model would need every rank in lock-step for each decode step.
        self.engine = build_engine(cfg, tokenizer, self.dtype, self.device)
        # Per-phase micro-batch sizes as they stand after any OOM halving, and call counts (the
        # step, for once-a-step phases) for fault injection.
        self.sizes: dict[str, MicroSize] = {}
        self.calls: dict[str, int] = {}

    # ---------------------------------------------------------------- phases
    def generate(self, prompt_ids: list[list[int]], params: dict) -> tuple[dict, dict]:
        metrics: dict = {}
        self.calls["gen"] = self.calls.get("gen", 0) + 1
        with measure("gen", metrics, self.device):
            sampling = SamplingParams(**{**params, "seed": params.get("seed", 0) * 1009 + self.rank})
            out = self._generate(prompt_ids, sampling)
            if self.cfg.actor_rollout_ref.rollout.free_cache_engine:
                # Training gets the engine's memory back until the next generate (vLLM sleep mode on
                # CUDA; on CPU only the prefix cache is dropped, see rollout/vllm.py).
                self.engine.sleep()
        return {"responses": out.responses.cpu(), "response_mask": out.response_mask.cpu(),
                "rollout_log_probs": out.log_probs.cpu(), "prompt_index": out.prompt_index.cpu()}, \
            self._size_metrics("gen", metrics)

    def _size_metrics(self, phase: str, metrics: dict) -> dict:
        """The phase's micro-batch as it stands, and how often an OOM halved it (0 normally)."""
        if phase in self.sizes:
            metrics[f"perf/oom_retries/{phase}"] = self.sizes[phase].retries
            metrics[f"perf/micro_size/{phase}"] = self.sizes[phase].value
        return metrics

    def _generate(self, prompt_ids: list[list[int]], sampling: SamplingParams):
        """The engine's generate; with an engine that decodes in micro-batches (hf), an OOM halves
        them and re-runs: rows are seeded one by one, so the responses come out the same."""
        if not hasattr(self.engine, "micro_batch_size"):
            return self.engine.generate(prompt_ids, sampling)
        if "gen" not in self.sizes:
            self.sizes["gen"] = MicroSize("gen", "actor_rollout_ref.rollout.max_num_seqs", self.engine.micro_batch_size)

        def attempt(size: int):
            self.engine.micro_batch_size, self.engine.calls = size, self.calls["gen"]
            return self.engine.generate(prompt_ids, sampling)

        return retry_on_oom(self.sizes["gen"], attempt, self.device)

    def _forward(self, phase: str, model, batch: TensorDict, prefix: str) -> torch.Tensor:
        """Forward-only log-probs of `batch` under `model`, re-run with half the micro-batch after an OOM."""
        if phase not in self.sizes:  # from the config; an OOM halves it for the rest of the run
            section = OmegaConf.select(self.cfg, prefix)
            self.sizes[phase] = MicroSize.from_config(phase, prefix, section, section.log_prob_use_dynamic_bsz,
                                                      "log_prob_micro_batch_size_per_gpu",
                                                      "log_prob_max_token_len_per_gpu")
        self.calls[phase] = self.calls.get(phase, 0) + 1
        size = self.sizes[phase]
        return retry_on_oom(size, lambda _: forward_logprobs(model, batch, size, self.temperature,
                                                             call=self.calls[phase]), self.device)

    def compute_log_prob(self, batch: TensorDict) -> tuple[torch.Tensor, dict]:
        metrics: dict = {}
        with measure("old_log_prob", metrics, self.device):
            out = self._forward("old_log_prob", self.actor.model, batch.to(self.device), "actor_rollout_ref.rollout")
        return out.cpu(), self._size_metrics("old_log_prob", metrics)

    def compute_ref_log_prob(self, batch: TensorDict) -> tuple[torch.Tensor, dict]:
        metrics: dict = {}
        with measure("ref", metrics, self.device):
            batch = batch.to(self.device)
            if self.ref_model is None:
                with self.actor.model.disable_adapter():
                    out = self._forward("ref", self.actor.model, batch, "actor_rollout_ref.ref")
            else:
                out = self._forward("ref", self.ref_model, batch, "actor_rollout_ref.ref")
        return out.cpu(), self._size_metrics("ref", metrics)

    def compute_values(self, batch: TensorDict) -> tuple[torch.Tensor, dict]:
        metrics: dict = {}
        if "values" not in self.sizes:
            self.sizes["values"] = MicroSize("values", "critic.ppo_micro_batch_size_per_gpu",
                                             self.cfg.critic.ppo_micro_batch_size_per_gpu)
        with measure("values", metrics, self.device):
            batch = batch.to(self.device)
            out = retry_on_oom(self.sizes["values"], lambda s: self.critic.compute_values(batch, s), self.device)
        return out.cpu(), self._size_metrics("values", metrics)

    def update_actor(self, batch: TensorDict, per_rank_mini: int) -> dict:
        metrics: dict = {}
        with measure("update_actor", metrics, self.device):
            metrics.update(self.actor.update(batch.to(self.device), per_rank_mini))
        return metrics

    def update_critic(self, batch: TensorDict, per_rank_mini: int) -> dict:
        metrics: dict = {}
        with measure("update_critic", metrics, self.device):
            metrics.update(self.critic.update(batch.to(self.device), per_rank_mini,
                                              self.cfg.actor_rollout_ref.actor.loss_agg_mode))
        return metrics

    def sync_weights(self) -> dict:
        metrics: dict = {}
        stream: dict = {}
        bucket_mb = self.cfg.actor_rollout_ref.rollout.update_weights_bucket_mb
        with measure("update_weights", metrics, self.device):
            self.engine.sync_weights(iter_engine_weights(self.actor.model, bucket_mb, stream))
        # The gathered bytes the stream held at once (its largest bucket), counted as it goes: free,
        # unlike an allocation tracker; the engine's own share shows in perf/memory/update_weights/.
        metrics["perf/update_weights/bucket_peak_mb"] = stream["peak_bucket_bytes"] / 2**20
        metrics["perf/update_weights/buckets"] = stream["buckets"]
        return metrics

    # ---------------------------------------------------------------- checkpoints
    def save_checkpoint(self, directory: str, save_hf: bool, merge_lora: bool) -> dict:
        """Every rank writes its shards into `directory` (the controller's tmp dir, committed after)."""
        metrics: dict = {}
        with measure("save", metrics, self.device):
            directory = Path(directory)
            # With LoRA only the adapter trains: the base comes back from model.path on load.
            save_sharded(directory / "actor", self.actor.model, self.actor.optimizer, self.actor.scheduler,
                         trainable_only=self.lora)
            if self.critic is not None:
                save_sharded(directory / "critic", self.critic.model, self.critic.optimizer, self.critic.scheduler)
            if save_hf:
                export_hf(self.actor.model, directory / "huggingface", self.cfg.actor_rollout_ref.model.path,
                          merge_lora=merge_lora)
        return metrics

    def resume_from(self, directory: str) -> None:
        """Continue a run: weights, optimizer, scheduler and RNG of actor (and critic), engine re-synced."""
        directory = Path(directory)
        load_sharded(directory / "actor", self.actor.model, self.actor.optimizer, self.actor.scheduler)
        if self.critic is not None:
            load_sharded(directory / "critic", self.critic.model, self.critic.optimizer, self.critic.scheduler,
                         restore_rng=False)
        self.sync_weights()  # the engine still holds the weights it was built with

    def start_from(self, directory: str, carry_optimizer: bool) -> None:
        """Start a curriculum stage from the previous stage's final checkpoint.

        The actor (and, when both stages have one, the critic) takes its weights; so does the
        reference model, as in Logic-RL, where each stage is a new run from the last stage's
        weights (with LoRA the reference stays the base model: the adapter switched off). The lr
        schedule restarts; the Adam moments come along only with `carry_optimizer`.
        """
        directory = Path(directory)
        models = [(self.actor, directory / "actor")]
        if self.critic is not None and (directory / "critic").is_dir():
            models.append((self.critic, directory / "critic"))
        for part, path in models:
            load_stage_start(path, part.model, part.optimizer, part.scheduler, carry_optimizer)
        if self.ref_model is not None:
            load_sharded(directory / "actor", self.ref_model, None, restore_rng=False)
        self.sync_weights()

    # ---------------------------------------------------------------- for tests
    def actor_state(self) -> dict[str, torch.Tensor]:
        return {k: v.cpu().clone() for k, v in iter_engine_weights(self.actor.model)}

    def ref_state(self) -> dict[str, torch.Tensor]:
        if self.ref_model is None:
            return {}
        return {k: v.cpu().clone() for k, v in iter_engine_weights(self.ref_model)}
