"""One worker per rank: the FSDP2 actor, the reference, the critic, the reward model and the rollout engine.

This is the hybrid engine of DESIGN.md: every rank generates for its own shard of prompts with
its engine, trains its shard of the actor, and after each update streams the new weights into
its engine. A plain class: tests build it directly; Ray only places it (controller/).

Every phase is one method with one declaration above it (`@worker_phase`): the model it runs and
whether it is forward-only come from its row in config/phases.py; the declaration adds whether an
OOM retries it. `run(batch, phase, step)` reads only the declarations: it times the phase, measures
its memory (`perf/memory/<phase>/...`), hands it its OOM retry (workers/oom.py) with the phase's
micro-batch from the step plan (halved by an OOM for the rest of the run), reshards after a forward
without a backward, and fires test-injected faults (logicrl/faults.py). A phase takes the rank's
TensorDict shard (None for update_weights) and returns `(what it adds or None, metrics)`; tensors
cross the Ray boundary on CPU and `run` moves them to the rank's device and back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict

from logicrl.algos import RolloutCorrection
from logicrl.checkpoint_layout import step_of
from logicrl.config.phases import WORKER_PHASES
from logicrl.config.phases import phase as phase_row
from logicrl.config.plan import StepPlan
from logicrl.config.sequence_parallel import model_sp_sizes, phase_sp_size
from logicrl.faults import Faults
from logicrl.logs import quiet_worker
from logicrl.memory.telemetry import measure, tracks_tensors
from logicrl.models.attention import packed_attention
from logicrl.models.loading import (
    LoraSpec,
    QuantSpec,
    load_causal_lm,
    load_tokenizer,
    load_value_model,
    master_dtype,
    resolve_dtype,
)
from logicrl.models.reward_model import load_reward_model, sequence_scores
from logicrl.models.rm_inputs import retokenize, same_tokenizer
from logicrl.models.spec import load_model_spec
from logicrl.models.ulysses import sequence_parallel_group, use_ulysses
from logicrl.workers.actor import Actor, forward_logprobs, logprob_diff_metrics
from logicrl.workers.checkpoint import (
    export_hf,
    load_sharded,
    load_stage_start,
    save_sharded,
)
from logicrl.workers.critic import Critic
from logicrl.workers.devices import pick_device
from logicrl.workers.fsdp import (
    build_optimizer,
    has_nonfinite,
    init_distributed,
    offload_optimizer,
    optimizer_tensors,
    reshard,
)
from logicrl.workers.oom import MicroSize, phase_retry
from logicrl.workers.rollout import SamplingParams
from logicrl.workers.rollout.engines import build_engine
from logicrl.workers.sharded_load import load_sharded_model
from logicrl.workers.update import Trained
from logicrl.workers.weight_sync import iter_adapter_weights, iter_engine_weights


@dataclass(frozen=True)
class WorkerPhase:
    """What `HybridWorker.run` needs to run one phase: its method, and the rest from config/phases.py."""

    name: str  # a row of config/phases.py that runs on a worker
    method: Callable  # (worker, batch on the rank's device or None, retry or None, **kwargs) -> (out, metrics)
    # An OOM halves the phase's micro-batch (its row's rows_key, or budget_key with use_dynamic_bsz, as
    # the step plan set it) and re-runs it: the method's `retry` hands each attempt that MicroSize.
    retried: bool

    @property
    def model(self) -> str:
        """The model it runs: "actor", "ref", "critic", "reward_model" (FSDP2) or "engine" (its own copy)."""
        return phase_row(self.name).model

    @property
    def resharded(self) -> bool:
        """A forward without a backward leaves FSDP2's root unit gathered (workers/fsdp.py reshard):
        `run` reshards after it, so that between phases every FSDP2 model holds only its shards."""
        return phase_row(self.name).forward_only


DECLARED: dict[str, WorkerPhase] = {}  # filled by @worker_phase on HybridWorker's methods


def worker_phase(name: str, *, retried: bool):
    """Declare the method below as the worker's phase `name` (config/phases.py must give it a model)."""
    if not phase_row(name).on_worker:
        raise ValueError(f"{name} runs on the controller (config/phases.py gives it no model), not on a worker")

    def declare(method: Callable) -> Callable:
        DECLARED[name] = WorkerPhase(name, method, retried)
        return method

    return declare


@torch.no_grad()
def poison(model: torch.nn.Module) -> None:
    """Fill this rank's shard of the model's first trainable parameter with NaN (the `nan` test fault)."""
    param = next(p for p in model.parameters() if p.requires_grad)
    (param.to_local() if hasattr(param, "to_local") else param).fill_(float("nan"))


class HybridWorker:
    def __init__(self, config: dict, plan: StepPlan, rank: int, world_size: int, master_addr: str,
                 master_port: int, threads: int | None = None, faults: Faults | None = None,
                 log_file: str | None = None):
        if log_file:  # engine and Ray output to the run's log file, not the console (logicrl/logs.py)
            quiet_worker(log_file, rank)
        cfg: DictConfig = OmegaConf.create(config)
        self.cfg, self.plan, self.rank, self.world_size = cfg, plan, rank, world_size
        self.faults = faults or Faults()
        if threads:
            torch.set_num_threads(threads)
        self.device = pick_device(cfg.trainer.device, rank)
        self.mesh = init_distributed(rank, world_size, master_addr, master_port, self.device,
                                     cfg.trainer.collective_timeout_s)
        torch.manual_seed(cfg.trainer.seed)
        arr, model_cfg = cfg.actor_rollout_ref, cfg.actor_rollout_ref.model
        self.dtype = resolve_dtype(model_cfg.dtype, self.device)
        self.temperature = arr.rollout.temperature
        tokenizer = load_tokenizer(model_cfg.path, quiet=True)
        self.lora = model_cfg.lora_rank > 0
        # Each phase's micro-batch as it stands: the plan's, halved by an OOM for the rest of the run.
        # Ulysses sequence parallelism (models/ulysses.py): in a phase of a model with SP size S, groups of
        # S consecutive ranks hold the same rows (the controller sends each group one shard, trainer/ppo.py),
        # each rank running 1/S of every packed row. A token budget then packs S times the tokens of one
        # rank's share (verl scales it the same way; MicroSize.group); a mini-batch is S ranks' worth of
        # rows. Every rank creates every group size's groups, in one order.
        self.sizes = {p.name: MicroSize(p.name, p.micro.key, p.micro.value, by_tokens=p.micro.by_tokens,
                                        group=phase_sp_size(cfg, p.name))
                      for p in plan.phases if p.micro is not None}
        in_use = {"actor": True, "ref": plan.runs("ref"), "critic": plan.critic is not None,
                  "reward_model": plan.runs("reward_model")}
        sp_sizes = {model: s if in_use[model] else 1 for model, s in model_sp_sizes(cfg).items()}
        groups = {s: sequence_parallel_group(s) for s in sorted(set(sp_sizes.values()))}
        self.sp = {model: groups[s] for model, s in sp_sizes.items()}  # None where S = 1

        lora = LoraSpec(model_cfg.lora_rank, model_cfg.lora_alpha, model_cfg.target_modules) if self.lora else None
        # The actor and critic keep fp32 master weights and AdamW states when self.dtype (the compute
        # dtype: the engine's and the reference's) is narrower; FSDP2 computes in self.dtype.
        # With LoRA only the adapters train: the frozen base is stored in self.dtype (fp32 would double
        # its memory for nothing to update) and the adapters are the fp32 masters (peft's autocast,
        # models/loading.py); the same policy gathers them in self.dtype, so they compute in bf16
        # inside a bf16 model, as the base does, while AdamW still updates fp32 (at Logic-RL's lr a bf16
        # weight rounds almost every update away).
        master = master_dtype(self.dtype)
        mixed = self.dtype if master != self.dtype else None
        path, ckpt = model_cfg.path, model_cfg.enable_gradient_checkpointing
        actor_dtype = self.dtype if self.lora else master
        attn = packed_attention(model_cfg.use_remove_padding, self.device, self.dtype)
        # A 4-bit base (QLoRA, models/quantize.py): quantized on the rank's device by every rank, kept whole.
        quant = QuantSpec(model_cfg.quantization, model_cfg.quantization_block_size,
                          model_cfg.quantization_scaler_block_size, self.device) if model_cfg.quantization else None
        # A GPTQ checkpoint (models/gptq.py): every rank reads its int4 buffers, which FSDP2 leaves whole.
        gptq_base = load_model_spec(path).quant_method == "gptq"
        actor_model = load_sharded_model(lambda meta: load_causal_lm(path, actor_dtype, ckpt, lora, on_meta=meta,
                                                                     attn_implementation=attn, quant=quant),
                                         self.mesh, self.device, arr.actor.fsdp_config.param_offload, mixed,
                                         every_rank_loads=quant is not None or gptq_base)
        self._ulysses(actor_model, "actor")
        self.remove_padding = model_cfg.use_remove_padding  # the actor's and the reference's forwards
        self.actor = Actor(self._trained("actor", actor_model, arr.actor, arr.actor.loss_agg_mode, plan.actor),
                           arr.actor, self.temperature, self.remove_padding,
                           RolloutCorrection.from_config(cfg.algorithm.rollout_correction), self.sp["actor"])

        # With LoRA the reference is the actor with its adapter switched off: no second copy.
        self.ref_model = None
        if plan.runs("ref") and not self.lora:
            self.ref_model = load_sharded_model(lambda meta: load_causal_lm(path, self.dtype, on_meta=meta,
                                                                            attn_implementation=attn),
                                                self.mesh, self.device, arr.ref.fsdp_config.param_offload)
            self.ref_model.requires_grad_(False)
            self._ulysses(self.ref_model, "ref")

        self.critic = None
        if plan.critic is not None:
            c = cfg.critic
            critic_ckpt = c.model.enable_gradient_checkpointing
            critic_attn = packed_attention(c.model.use_remove_padding, self.device, self.dtype)
            critic_model = load_sharded_model(
                lambda meta: load_value_model(c.model.path, master, critic_ckpt, on_meta=meta,
                                              attn_implementation=critic_attn),
                self.mesh, self.device, c.fsdp_config.param_offload, mixed)
            self._ulysses(critic_model, "critic")
            # The critic's loss is aggregated like the actor's (verl shares the key).
            self.critic = Critic(self._trained("critic", critic_model, c, arr.actor.loss_agg_mode, plan.critic),
                                 c.cliprange_value, c.model.use_remove_padding, self.sp["critic"])

        self.reward_model, self.rm_tokenizers = None, None
        if plan.runs("reward_model"):
            self._load_reward_model(cfg.reward_model, tokenizer)

        # The engine holds its own full copy of the policy: generation lengths differ per rank,
        # and a sharded model would need every rank in lock-step for each decode step.
        self.engine = build_engine(cfg, tokenizer, self.dtype, self.device, plan.micro("generate").value)
        # Whether the engine's base is the trainer's. Over a 4-bit base it is not: the engine loaded the
        # checkpoint's own weights, the policy computes with their 4-bit round trip. The adapter sync
        # then sends the dequantized base once, here, and never again; the merged sync sends it each time.
        self.engine_has_base = quant is None
        self.first_sync = None  # the metrics of the sync at build (over a 4-bit base), which no step reports
        if quant is not None:
            # The first generation must already sample from the 4-bit policy (rollout/logprob_diff from step 1).
            self.first_sync = self._update_weights(None, None)[1]

    def _load_reward_model(self, rm: DictConfig, actor_tokenizer) -> None:
        """The learned reward model: frozen, sharded on meta and offloaded like the reference, in the
        compute dtype; and the two tokenizers when its own differs from the one that wrote the actor's tokens."""
        path, code = rm.model.path, rm.model.trust_remote_code
        self.rm_remove_padding = rm.model.use_remove_padding
        attn = packed_attention(self.rm_remove_padding, self.device, self.dtype)
        self.reward_model = load_sharded_model(
            lambda meta: load_reward_model(path, self.dtype, code, on_meta=meta, attn_implementation=attn),
            self.mesh, self.device, rm.model.fsdp_config.param_offload)
        self.reward_model.requires_grad_(False)
        self._ulysses(self.reward_model, "reward_model")
        source = rm.model.input_tokenizer
        if source:  # null: score the actor's tokens as they are (verl's switch)
            actor = actor_tokenizer if source == self.cfg.actor_rollout_ref.model.path else load_tokenizer(source,
                                                                                                        quiet=True)
            own = load_tokenizer(path, quiet=True)
            if not same_tokenizer(actor, own):
                self.rm_tokenizers = (actor, own)
        data = self.cfg.data
        self.rm_max_length = rm.max_length or data.max_prompt_length + data.max_response_length

    def _ulysses(self, model, name: str) -> None:
        """Attention inside an all-to-all over this rank's SP group (models/ulysses.py); nothing at SP 1."""
        if self.sp[name] is not None:
            use_ulysses(model)

    def _trained(self, name: str, model, role_cfg: DictConfig, loss_agg_mode: str, update) -> Trained:
        if (sp := self.sp[name]) is not None:  # the rank holds its SP group's rows: S ranks' share of a mini-batch
            update = replace(update, per_rank_mini=update.per_rank_mini * sp.size)
        o = role_cfg.optim
        optimizer, scheduler = build_optimizer(model, o.lr, o.weight_decay, self.plan.total_steps,
                                               o.lr_warmup_steps_ratio, o.lr_scheduler_type, o.lr_warmup_steps)
        return Trained(name=name, model=model, optimizer=optimizer, scheduler=scheduler, plan=update,
                       loss_agg_mode=loss_agg_mode, grad_clip=role_cfg.grad_clip, world_size=self.world_size,
                       device=self.device, optimizer_offload=role_cfg.fsdp_config.optimizer_offload,
                       sharded_grads=update.sharded_grads)

    def _park_optimizers(self) -> None:
        """A loaded checkpoint puts AdamW's states beside the parameters; optimizer_offload keeps
        them on the host until the next update (workers/update.py)."""
        for part in (self.actor, self.critic):
            if part is not None and part.role.optimizer_offload:
                offload_optimizer(part.optimizer)

    # ---------------------------------------------------------------- the phase wrapper
    def run(self, batch: TensorDict | None, phase: str, step: int | None = None,
            **kwargs) -> tuple[TensorDict | None, dict]:
        """Run one phase on this rank's shard; `step` labels test faults (None: none fire)."""
        declared = DECLARED.get(phase)
        if declared is None:
            raise ValueError(f"no worker phase {phase!r}; they are {', '.join(WORKER_PHASES)}")
        self.faults.fail_worker_if_due(phase, step, self.rank)  # test-injected failures; a no-op unless asked
        metrics: dict = {}
        model = self._sharded(declared.model)
        size = self.sizes[phase] if declared.retried else None
        # Only generate wakes the whole engine; other phases see it asleep (or only its weights, for the sync).
        with measure(phase, metrics, self.device, engine_awake=phase == "generate", track_tensors=tracks_tensors(step)):
            # The sharded model tells the retry that the phase runs FSDP2 collectives: there an OOM
            # on several ranks ends the run instead of retrying in place (workers/oom.py).
            retry = None if size is None else phase_retry(size, self.device, self.faults, step, self.rank, model)
            out, phase_metrics = declared.method(self, None if batch is None else batch.to(self.device), retry,
                                                 **kwargs)
            if declared.resharded:
                reshard(model)
        if model is not None and self.faults.nan_due(phase, step, self.rank):
            poison(model)  # test-injected: weights gone NaN, as a diverged update would leave them
        metrics.update(phase_metrics)
        if size is not None:  # the micro-batch as it stands, and how often an OOM halved it (0 normally)
            metrics[f"perf/oom_retries/{phase}"] = size.retries
            metrics[f"perf/micro_size/{phase}"] = size.value
        return (None if out is None else out.cpu()), metrics

    def _sharded(self, model: str) -> torch.nn.Module | None:
        """The FSDP2 model behind a phase's `model` (config/phases.py); None for the engine, which
        holds its own full copy and runs no collectives with the other ranks."""
        if model == "engine":
            return None
        if model == "ref" and self.ref_model is None:
            model = "actor"  # with LoRA the reference is the actor with its adapter off
        if model == "critic":
            return self.critic.model
        return {"actor": self.actor.model, "ref": self.ref_model, "reward_model": self.reward_model}[model]

    # ---------------------------------------------------------------- phases
    @worker_phase("generate", retried=True)  # where the engine decodes in micro-batches (hf)
    def _generate(self, batch: TensorDict, retry, params: dict):
        """One response per row of the left-padded prompts; adds the full sequences and masks."""
        sampling = SamplingParams(**{**params, "seed": params.get("seed", 0) * 1009 + self.rank})
        prompts, prompt_mask = batch["input_ids"], batch["attention_mask"]
        if not self.engine.weights_valid:
            # A level-2 sleep discarded the engine's weights and no update_weights ran since (the
            # critic warm-up steps skip it): stream the actor's (unchanged) weights back in first.
            self._update_weights(None, None)
        if self.engine.micro_batch_size is None:
            # vLLM schedules its own batches: no micro-batch to halve, so its OOM is not retried.
            out = self.engine.generate(prompts, prompt_mask, sampling)
        else:
            # hf decodes in micro-batches; rows are seeded one by one, so a halved retry gives the same responses.
            out = retry(lambda size: self.engine.generate(prompts, prompt_mask, sampling,
                                                          micro_batch_size=size.value))
        if self.cfg.actor_rollout_ref.rollout.free_cache_engine:
            # Training gets the engine's memory back until the next generate (vLLM sleep mode on
            # CUDA; on CPU only the prefix cache is dropped, see rollout/vllm.py).
            self.engine.sleep()
        responses, attended = out.responses.to(self.device), out.response_attention_mask.to(self.device).long()
        # What every forward sees comes from the attention mask, never the loss mask: a span attended but
        # not trained (tool output) stays in the sequence and keeps its positions.
        attention_mask = torch.cat([prompt_mask, attended], dim=1)  # [N, P+R]
        return TensorDict({
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            # Positions count real tokens only, as the engine saw them.
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_attention_mask": attended,
            "response_mask": out.response_mask.to(self.device).long(),  # the loss mask
            "rollout_log_probs": out.log_probs.to(self.device),
        }, batch_size=[len(responses)]), {}

    @worker_phase("old_log_prob", retried=True)
    def _old_log_prob(self, batch: TensorDict, retry):
        log_probs = retry(lambda size: forward_logprobs(self.actor.model, batch, size, self.temperature,
                                                        self.remove_padding, self.sp["actor"]))
        return TensorDict({"old_log_probs": log_probs}, batch_size=batch.batch_size), \
            logprob_diff_metrics(log_probs, batch)

    @worker_phase("ref", retried=True)
    def _ref(self, batch: TensorDict, retry):
        model = self._sharded("ref")
        # With LoRA the reference is the actor with its adapter off.
        with self.actor.model.disable_adapter() if self.ref_model is None else nullcontext():
            out = retry(lambda size: forward_logprobs(model, batch, size, self.temperature, self.remove_padding,
                                                      self.sp["ref"]))
        return TensorDict({"ref_log_probs": out}, batch_size=batch.batch_size), {}

    @worker_phase("values", retried=True)
    def _values(self, batch: TensorDict, retry):
        out = retry(lambda size: self.critic.compute_values(batch, size))
        return TensorDict({"values": out}, batch_size=batch.batch_size), {}

    @worker_phase("reward_model", retried=True)
    def _reward_model(self, batch: TensorDict, retry):
        """The learned score of each row, read at its last real token: `rm_scores` [N] fp32.

        With a reward tokenizer of its own the rows are re-rendered from the prompt's chat
        (`raw_prompt`, which the controller sends for this phase) and the decoded response
        (models/rm_inputs.py); otherwise the actor's tokens are scored as they are."""
        rows, metrics = batch, {}
        if self.rm_tokenizers is not None:
            actor, own = self.rm_tokenizers
            inputs = retokenize(list(batch["raw_prompt"]), batch["responses"], batch["response_attention_mask"], actor,
                                own, self.rm_max_length)
            rows = TensorDict({"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask,
                               "position_ids": inputs.position_ids}, batch_size=batch.batch_size)
            metrics["reward_model/truncated"] = float(inputs.truncated)
        scores = retry(lambda size: self._rm_scores(rows, size))
        return TensorDict({"rm_scores": scores}, batch_size=batch.batch_size), metrics

    @torch.no_grad()
    def _rm_scores(self, rows: TensorDict, size: MicroSize) -> torch.Tensor:
        """[N] scores, split as `size` says (rows, or packed to a token budget), back in the rows' order."""
        parts, order = size.split(rows, rows.device, with_index=True)
        out = torch.cat([sequence_scores(self.reward_model, mb["input_ids"], mb["attention_mask"],
                                         mb["position_ids"], self.rm_remove_padding, self.sp["reward_model"])
                         for mb in parts])
        return out if order is None else out[torch.argsort(order)]

    @worker_phase("update_actor", retried=True)
    def _update_actor(self, batch: TensorDict, retry):
        return None, self.actor.update(batch, retry)

    @worker_phase("update_critic", retried=True)
    def _update_critic(self, batch: TensorDict, retry):
        return None, self.critic.update(batch, retry)

    @worker_phase("update_weights", retried=False)  # streamed in buckets of a fixed size: nothing to halve
    def _update_weights(self, _batch: None, _retry):
        stream: dict = {}
        rollout = self.cfg.actor_rollout_ref.rollout
        adapters = self.lora and rollout.lora_sync == "adapters"
        start = time.perf_counter()
        base: dict = {}
        # Cast to the engine's dtype shard by shard, before gathering: half the bytes all-gathered.
        if adapters:  # only the LoRA A/B tensors: the engine holds the base since it was built
            if not self.engine_has_base:  # once, over a 4-bit base: dequant(W), no adapters (vLLM drops its own)
                self.engine.sync_weights(iter_engine_weights(self.actor.model, rollout.update_weights_bucket_mb,
                                                             base, dtype=self.dtype, merge_lora=False))
                self.engine_has_base = True
            self.engine.sync_adapters(iter_adapter_weights(self.actor.model, self.dtype, stream))
        else:
            self.engine.sync_weights(iter_engine_weights(self.actor.model, rollout.update_weights_bucket_mb, stream,
                                                         dtype=self.dtype))
        metrics = {"perf/update_weights/bytes": stream["bytes"] + base.get("bytes", 0), "perf/update_weights/seconds":
                   time.perf_counter() - start, "perf/update_weights/adapters_only": float(adapters)}
        if base:  # the one-time base stream, counted in bytes above
            metrics["perf/update_weights/base_bytes"] = base["bytes"]
        if not adapters:
            # The gathered bytes the stream held at once (its largest bucket), counted as it goes: free,
            # unlike an allocation tracker; the engine's own share shows in perf/memory/update_weights/.
            metrics.update({"perf/update_weights/bucket_peak_mb": stream["peak_bucket_bytes"] / 2**20,
                            "perf/update_weights/buckets": stream["buckets"]})
        return None, metrics

    # ---------------------------------------------------------------- checkpoints
    def nonfinite_state(self) -> list[str]:
        """What of this rank's trained state holds NaN or inf ("actor weights", "critic optimizer state"):
        the controller asks before every save and saves nothing if any rank names something. Each rank
        checks only its own shards and the controller ORs the answers, so no collective runs here."""
        found = []
        for part in (self.actor, self.critic):
            if part is None:
                continue
            if has_nonfinite(p for p in part.model.parameters() if p.requires_grad):
                found.append(f"{part.role.name} weights")
            if has_nonfinite(optimizer_tensors(part.optimizer)):
                found.append(f"{part.role.name} optimizer state")
        return found

    def save_checkpoint(self, directory: str, save_hf: bool, merge_lora: bool) -> dict:
        """Every rank writes its shards into `directory` (the controller's tmp dir, committed after). The
        reference and the reward model are frozen: they load again from their paths, never from here."""
        metrics: dict = {}
        directory = Path(directory)
        # A test's full disk or read-only directory (logicrl/faults.py), met by the first file written.
        fault = self.faults.disk_error_due("save", step_of(directory), self.rank)
        # Not a phase of the step (the plan has no row for it): its memory goes under perf/checkpoint/.
        with measure("save", metrics, self.device, memory_prefix="perf/checkpoint"):
            # With LoRA only the adapter trains: the base comes back from model.path on load.
            save_sharded(directory / "actor", self.actor.model, self.actor.optimizer, self.actor.scheduler,
                         trainable_only=self.lora, fault=fault)
            if self.critic is not None:
                save_sharded(directory / "critic", self.critic.model, self.critic.optimizer, self.critic.scheduler)
            if save_hf:
                export_hf(self.actor.model, directory / "huggingface", self.cfg.actor_rollout_ref.model.path,
                          merge_lora=merge_lora, dtype=self.dtype)
        return metrics

    def resume_from(self, directory: str) -> None:
        """Continue a run: weights, optimizer, scheduler and RNG of actor (and critic), engine re-synced."""
        directory = Path(directory)
        load_sharded(directory / "actor", self.actor.model, self.actor.optimizer, self.actor.scheduler)
        if self.critic is not None:
            load_sharded(directory / "critic", self.critic.model, self.critic.optimizer, self.critic.scheduler,
                         restore_rng=False)
        self._park_optimizers()
        self._update_weights(None, None)  # the engine still holds the weights it was built with

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
        self._park_optimizers()
        self._update_weights(None, None)

    # ---------------------------------------------------------------- for tests
    def actor_state(self) -> dict[str, torch.Tensor]:
        """The actor's full weights as stored (fp32 masters under a narrower compute dtype)."""
        return {k: v.cpu().clone() for k, v in iter_engine_weights(self.actor.model)}

    def ref_state(self) -> dict[str, torch.Tensor]:
        if self.ref_model is None:
            return {}
        return {k: v.cpu().clone() for k, v in iter_engine_weights(self.ref_model)}
