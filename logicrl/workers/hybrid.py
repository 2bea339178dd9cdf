"""One worker per rank: the FSDP2 actor, the reference, the critic, the reward model and the rollout engine.

This is the hybrid engine of DESIGN.md: every rank generates for its own shard of prompts with
its engine, trains its shard of the actor, and after each update streams the new weights into
its engine through an in-process transport (workers/transport.py). A plain class: tests build it
directly; Ray only places it (controller/). It composes the parts a split worker would take apart:
the models and the engine are built by workers/build.py, checkpoints are workers/trained_state.py's,
and the phase wrapper `run` (timing, memory, OOM retry, reshard, test faults) is workers/phase_worker.py's.

Every phase is one method with one declaration above it (`@worker_phase`): the model it runs and
whether it is forward-only come from its row in config/phases.py; the declaration adds whether an
OOM retries it.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict

from logicrl.checkpoint_layout import step_of
from logicrl.config.plan import StepPlan
from logicrl.faults import Faults
from logicrl.logs import quiet_worker
from logicrl.memory.telemetry import measure
from logicrl.models.reward_model import sequence_scores
from logicrl.models.rm_inputs import retokenize
from logicrl.workers import trained_state
from logicrl.workers.actor import forward_logprobs, logprob_diff_metrics
from logicrl.workers.build import build_models, build_rollout, init_rank, micro_sizes
from logicrl.workers.oom import MicroSize
from logicrl.workers.phase_worker import PhaseWorker, worker_phase
from logicrl.workers.rollout import SamplingParams
from logicrl.workers.rollout.multi_turn import row_tools_kwargs
from logicrl.workers.transport import InProcess, Payload
from logicrl.workers.weight_sync import adapter_meta, engine_weight_meta, iter_adapter_weights, iter_engine_weights


class HybridWorker(PhaseWorker):
    def __init__(self, config: dict, plan: StepPlan, rank: int, world_size: int, master_addr: str,
                 master_port: int, threads: int | None = None, faults: Faults | None = None,
                 log_file: str | None = None):
        where = self._start_rank(config, plan, rank, world_size, master_addr, master_port, threads, faults, log_file)
        cfg = self.cfg
        arr = cfg.actor_rollout_ref
        self.remove_padding = arr.model.use_remove_padding  # the actor's and the reference's forwards
        self.lora = arr.model.lora_rank > 0
        self.models = build_models(cfg, plan, where)
        self.sp = self.models.sp
        self.engine = build_rollout(cfg, plan, self.models.tokenizer, where)
        self.transport = InProcess(self.engine)
        self.adapters_only = self.lora and arr.rollout.lora_sync == "adapters"
        # The names, shapes and dtypes each sync carries, once (a transport between processes sizes its buckets).
        self.transport.describe("weights", engine_weight_meta(self.actor.model, self.dtype))
        if self.adapters_only:
            self.transport.describe("adapters", adapter_meta(self.actor.model, self.dtype))
        # Whether the engine's base is the trainer's. Over a 4-bit base it is not: the engine loaded the
        # checkpoint's own weights, the policy computes with their 4-bit round trip. The adapter sync
        # then sends the dequantized base once, here, and never again; the merged sync sends it each time.
        self.engine_has_base = not self.models.quantized_base
        self.first_sync = None  # the metrics of the sync at build (over a 4-bit base), which no step reports
        if self.models.quantized_base:
            # The first generation must already sample from the 4-bit policy (rollout/logprob_diff from step 1).
            self.first_sync = self._update_weights(None, None, version=0)[1]

    # What tests and the phases read of the built models.
    actor = property(lambda self: self.models.actor)
    critic = property(lambda self: self.models.critic)
    ref_model = property(lambda self: self.models.ref)
    reward_model = property(lambda self: self.models.reward and self.models.reward.module)
    rm_tokenizers = property(lambda self: self.models.reward and self.models.reward.tokenizers)


    def _start_rank(self, config: dict, plan: StepPlan, rank: int, world_size: int, master_addr: str,
                    master_port: int, threads: int | None, faults: Faults | None, log_file: str | None):
        """What every rank does first, whatever it holds (this class, and the two groups' workers): the
        config, the process group and device, the sampling temperature and micro-batch sizes; returns where."""
        if log_file:  # engine and Ray output to the run's log file, not the console (logicrl/logs.py)
            quiet_worker(log_file, rank)
        self.cfg: DictConfig = OmegaConf.create(config)
        self.plan, self.rank, self.world_size = plan, rank, world_size
        self.faults = faults or Faults()
        where = init_rank(self.cfg, rank, world_size, master_addr, master_port, threads)
        self.device, self.mesh, self.dtype = where.device, where.mesh, where.dtype
        self.temperature = self.cfg.actor_rollout_ref.rollout.temperature
        self.sizes = micro_sizes(self.cfg, plan)
        self.track_tensor_peaks = self.cfg.trainer.track_tensor_peaks
        return where
    def module(self, model: str) -> torch.nn.Module | None:
        return self.models.module(model)

    # ---------------------------------------------------------------- phases
    @worker_phase("generate", retried=True)  # where the engine decodes in micro-batches (hf)
    def _generate(self, batch: TensorDict, retry, params: dict):
        """One response per row of the left-padded prompts; adds the full sequences and masks."""
        sampling = SamplingParams(**{**params, "seed": params.get("seed", 0) * 1009 + self.rank})
        prompts, prompt_mask = batch["input_ids"], batch["attention_mask"]
        if not self.engine.weights_valid:
            # A level-2 sleep discarded the engine's weights and no update_weights ran since (the
            # critic warm-up steps skip it): stream the actor's (unchanged) weights back in first,
            # through the transport, at the version the engine had.
            self._update_weights(None, None, version=self.transport.version)
        # The rows' verl-style extra_info.tools_kwargs, sent (keep=extra_info) only to a multi-turn engine.
        tools = {"tools_kwargs": row_tools_kwargs(batch["extra_info"])} if "extra_info" in batch.keys() else {}
        if self.engine.micro_batch_size is None:
            # vLLM schedules its own batches: no micro-batch to halve, so its OOM is not retried.
            out = self.engine.generate(prompts, prompt_mask, sampling, **tools)
        else:
            # hf decodes in micro-batches; rows are seeded one by one, so a halved retry gives the same responses.
            out = retry(lambda size: self.engine.generate(prompts, prompt_mask, sampling,
                                                          micro_batch_size=size.value, **tools))
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
            **{name: value.to(self.device) for name, value in out.extras.items()},
        }, batch_size=[len(responses)]), {}

    @worker_phase("old_log_prob", retried=True)
    def _old_log_prob(self, batch: TensorDict, retry):
        log_probs = retry(lambda size: forward_logprobs(self.actor.model, batch, size, self.temperature,
                                                        self.remove_padding, self.sp["actor"]))
        return TensorDict({"old_log_probs": log_probs}, batch_size=batch.batch_size), \
            logprob_diff_metrics(log_probs, batch)

    @worker_phase("ref", retried=True)
    def _ref(self, batch: TensorDict, retry):
        model = self.module("ref")
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
        rows, metrics, rm = batch, {}, self.models.reward
        if rm.tokenizers is not None:
            actor, own = rm.tokenizers
            inputs = retokenize(list(batch["raw_prompt"]), batch["responses"], batch["response_attention_mask"], actor,
                                own, rm.max_length)
            rows = TensorDict({"input_ids": inputs.input_ids, "attention_mask": inputs.attention_mask,
                               "position_ids": inputs.position_ids}, batch_size=batch.batch_size)
            metrics["reward_model/truncated"] = float(inputs.truncated)
        scores = retry(lambda size: self._rm_scores(rows, size))
        return TensorDict({"rm_scores": scores}, batch_size=batch.batch_size), metrics

    @torch.no_grad()
    def _rm_scores(self, rows: TensorDict, size: MicroSize) -> torch.Tensor:
        """[N] scores, split as `size` says (rows, or packed to a token budget), back in the rows' order."""
        parts, order = size.split(rows, rows.device, with_index=True)
        rm = self.models.reward
        out = torch.cat([sequence_scores(rm.module, mb["input_ids"], mb["attention_mask"],
                                         mb["position_ids"], rm.remove_padding, self.sp["reward_model"])
                         for mb in parts])
        return out if order is None else out[torch.argsort(order)]

    @worker_phase("update_actor", retried=True)
    def _update_actor(self, batch: TensorDict, retry):
        return None, self.actor.update(batch, retry)

    @worker_phase("update_critic", retried=True)
    def _update_critic(self, batch: TensorDict, retry):
        return None, self.critic.update(batch, retry)

    @worker_phase("update_weights", retried=False)  # streamed in buckets of a fixed size: nothing to halve
    def _update_weights(self, _batch: None, _retry, version: int | None = None):
        """The actor's weights into the engine through the transport; `version` is the step whose update
        made them (None: the next after the engine's)."""
        version = self.transport.version + 1 if version is None else version
        stream: dict = {}
        bucket_mb = self.cfg.actor_rollout_ref.rollout.update_weights_bucket_mb
        start = time.perf_counter()
        base: dict = {}
        # Cast to the engine's dtype shard by shard, before gathering: half the bytes all-gathered.
        if self.adapters_only:  # only the LoRA A/B tensors: the engine holds the base since it was built
            if not self.engine_has_base:  # once, over a 4-bit base: dequant(W), no adapters (vLLM drops its own)
                self.transport.send(Payload("base", version, iter_engine_weights(
                    self.actor.model, bucket_mb, base, dtype=self.dtype, merge_lora=False)))
                self.engine_has_base = True
            self.transport.send(Payload("adapters", version, iter_adapter_weights(self.actor.model, self.dtype,
                                                                                  stream)))
        else:
            self.transport.send(Payload("weights", version, iter_engine_weights(self.actor.model, bucket_mb, stream,
                                                                                dtype=self.dtype)))
        metrics = {"perf/update_weights/bytes": stream["bytes"] + base.get("bytes", 0), "perf/update_weights/seconds":
                   time.perf_counter() - start, "perf/update_weights/adapters_only": float(self.adapters_only)}
        if base:  # the one-time base stream, counted in bytes above
            metrics["perf/update_weights/base_bytes"] = base["bytes"]
        if not self.adapters_only:
            # The gathered bytes the stream held at once (its largest bucket), counted as it goes: free,
            # unlike an allocation tracker; the engine's own share shows in perf/memory/update_weights/.
            metrics.update({"perf/update_weights/bucket_peak_mb": stream["peak_bucket_bytes"] / 2**20,
                            "perf/update_weights/buckets": stream["buckets"]})
        return None, metrics

    # ---------------------------------------------------------------- checkpoints (workers/trained_state.py)
    def nonfinite_state(self) -> list[str]:
        return trained_state.nonfinite_state(self.models)

    def save_checkpoint(self, directory: str, save_hf: bool, merge_lora: bool) -> dict:
        metrics: dict = {}
        directory = Path(directory)
        # A test's full disk or read-only directory (logicrl/faults.py), met by the first file written.
        fault = self.faults.disk_error_due("save", step_of(directory), self.rank)
        # Not a phase of the step (the plan has no row for it): its memory goes under perf/checkpoint/.
        with measure("save", metrics, self.device, memory_prefix="perf/checkpoint"):
            trained_state.save(self.models, directory, save_hf, merge_lora, self.cfg.actor_rollout_ref.model.path,
                               self.dtype, fault)
        return metrics

    def resume_from(self, directory: str) -> None:
        """Continue a run: the trained state as saved, and the engine re-synced (it holds the weights it was
        built with)."""
        trained_state.resume(self.models, Path(directory))
        self._update_weights(None, None, version=step_of(Path(directory)))

    def start_from(self, directory: str, carry_optimizer: bool) -> None:
        """Start a curriculum stage from the previous stage's final checkpoint (trained_state.start_stage)."""
        trained_state.start_stage(self.models, Path(directory), carry_optimizer)
        self._update_weights(None, None, version=0)

    # ---------------------------------------------------------------- for tests
    def actor_state(self) -> dict[str, torch.Tensor]:
        """The actor's full weights as stored (fp32 masters under a narrower compute dtype)."""
        return {k: v.cpu().clone() for k, v in iter_engine_weights(self.actor.model)}

    def ref_state(self) -> dict[str, torch.Tensor]:
        if self.ref_model is None:
            return {}
        return {k: v.cpu().clone() for k, v in iter_engine_weights(self.ref_model)}
