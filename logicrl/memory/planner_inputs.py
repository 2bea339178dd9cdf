"""What the memory planner reads from the step plan and a validated config, as one frozen record.

The planner works on this record, not on the config, so `auto_micro_batch` can try other
micro-batch sizes (`PlanInputs.with_micro`, by config key) or switches (`dataclasses.replace`)
and nothing is mutated. Batch sizes, each phase's split and which phases run are the step plan's
own `PhasePlan`s (config/plan.py); the config gives only what the plan does not hold (dtype,
offload, checkpointing, the engine's settings). `KNOBS` names the switches the suggestions may
set; micro-batch, token budget and use_dynamic_bsz keys are the phase table's (config/phases.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from omegaconf import DictConfig

from logicrl.config.plan import ARR, PhasePlan, StepPlan, swap_micro
from logicrl.config.sequence_parallel import phase_sp_size
from logicrl.memory.footprint import lora_targets
from logicrl.memory.lengths import TOKENIZER_FILES
from logicrl.models.quant_methods import gptq_bits, nf4_bits
from logicrl.models.attention import packed_kernel
from logicrl.models.spec import ModelSpec, load_model_spec
from logicrl.models.tiny import EMBEDDED_TINY, EMBEDDED_TINY_RM

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# The switches suggestions may set, by the PlanInputs field each stands for (reward_padding and
# reward_max_length have none: they are only named in refusals).
KNOBS = {
    "gpu_memory_utilization": f"{ARR}.rollout.gpu_memory_utilization",
    "kv_cache_gb": f"{ARR}.rollout.kv_cache_gb",
    "actor_offload": f"{ARR}.actor.fsdp_config.param_offload",
    "ref_offload": f"{ARR}.ref.fsdp_config.param_offload",
    "critic_offload": "critic.fsdp_config.param_offload",
    "reward_offload": "reward_model.model.fsdp_config.param_offload",
    "reward_padding": "reward_model.model.use_remove_padding",
    "reward_max_length": "reward_model.max_length",
    "actor_optim_offload": f"{ARR}.actor.fsdp_config.optimizer_offload",
    "critic_optim_offload": "critic.fsdp_config.optimizer_offload",
    "actor_ckpt": f"{ARR}.model.enable_gradient_checkpointing",
    "critic_ckpt": "critic.model.enable_gradient_checkpointing",
}


@dataclass(frozen=True)
class PlanInputs:
    spec: ModelSpec
    critic_spec: ModelSpec | None  # None: no critic (not gae)
    device: str  # "cuda" or "cpu": decides the dtype under "auto", and whether offload means anything
    dtype_bytes: int  # the compute dtype (model.dtype): activations, gathered parameters, the engine, the ref
    world: int  # FSDP ranks: every rank shards every model
    prompt_len: int
    response_len: int
    responses_per_rank: int
    # Every phase of the step plan: why it is skipped (None: it runs) and how it splits its rows. The reward
    # model's is planned whenever reward_spec is given, whatever the config says (a what-if).
    phases: tuple[PhasePlan, ...]
    # actor
    actor_per_rank_mini: int
    actor_ckpt: bool
    actor_offload: bool
    lora_rank: int
    lora_targets: tuple[str, ...]
    ref_offload: bool
    # critic
    critic_per_rank_mini: int
    critic_ckpt: bool
    critic_offload: bool
    # rollout
    engine: str  # the engine that generates: a row of config/engines.py (preflight/memory.py resolves a fallback)
    gpu_memory_utilization: float
    kv_cache_gb: float | None
    free_cache_engine: bool
    max_num_batched_tokens: int
    # A frozen 4-bit base: bits per weight of its decoder Linears (quantization=nf4, a GPTQ checkpoint's
    # quantization_config, or a what-if); replicated on every rank (models/quantize.py); and whether the
    # engine holds the base in the compute dtype instead (nf4: it loads the bf16 checkpoint and takes
    # the dequantized weights: once with the adapter sync, merged each sync otherwise) or in 4 bits (a
    # pre-quantized checkpoint vLLM loads as it is).
    base_weight_bits: float | None = None
    base_replicated: bool = False
    engine_full_precision: bool = False
    # rollout.lora_sync with LoRA: "adapters" (each sync the A/B tensors alone; over an NF4 base the
    # dequantized base once, at build) or "merged" (the whole model, adapters folded in, every sync).
    lora_sync: str = "merged"
    # the reward model (reward_model.enable): its shape, held like the reference; given as a what-if
    # (benchmarks/memory_cases.py) it runs whatever the config says, split as reward_model's keys say
    reward_spec: ModelSpec | None = None
    reward_offload: bool = False
    reward_packing: str | None = None
    # Re-rendered rows (its tokenizer differs from the actor's: models/rm_inputs.py) are the reward model's
    # own tokens, up to reward_model.max_length each, whatever the actor's lengths: the plan takes that
    # length. 0: it scores the actor's rows as they are (width).
    reward_rerender_len: int = 0
    update_weights_bucket_mb: int = 0  # weight sync gathers buckets of at most this (0: one tensor at a time)
    # optimizer_offload: AdamW states on the host outside their update (workers/update.py)
    actor_optim_offload: bool = False
    critic_optim_offload: bool = False
    rollout_tp: int = 1  # the engine's tensor parallelism (vLLM): each rank's engine holds 1/tp of the weights
    # Sequence lengths (memory/lengths.py): prompt_len / response_len above are what the plan is for;
    # worst_case plans data.max_prompt_length / max_response_length, kept here for what must hold at
    # any length (a token budget) and for the response-length bisection (fit.stop_lengths).
    plan_mode: str = "worst_case"
    lengths_note: str = ""
    max_prompt_len: int = 0  # 0: prompt_len is the full length
    max_response_len: int = 0
    # fsdp_config.grad_accumulation: "sharded", "unsharded" or "auto" (planner.py resolves it from memory)
    actor_grad_accum: str = "unsharded"
    critic_grad_accum: str = "unsharded"
    # use_remove_padding: None (padded) or the packed kernel's attn_implementation (models/attention.py
    # packed_kernel: "flash_attention_2" or "logicrl_packed_sdpa", neither with a mask)
    packing: str | None = None  # the actor's and the reference's forwards
    critic_packing: str | None = None
    # Responses one rank generates per round: responses_per_rank, or with dynamic sampling
    # (algorithm.filter_groups) data.gen_batch_size's share (0: responses_per_rank).
    gen_responses_per_rank: int = 0
    # Ulysses sequence parallelism (models/ulysses.py): (phase, S) for each phase whose model has S > 1
    sequence_parallel: tuple[tuple[str, int], ...] = ()

    def sp_of(self, name: str) -> int:
        """Ranks that split `name`'s rows (1 without sequence parallelism)."""
        return dict(self.sequence_parallel).get(name, 1)

    def phase(self, name: str) -> PhasePlan:
        return next(p for p in self.phases if p.name == name)

    def skipped(self, name: str) -> str | None:
        """Why the step plan skips `name` (config/plan.py), or None when it runs."""
        return self.phase(name).skipped

    def split(self, name: str) -> tuple[int | None, int | None]:
        """(rows per micro-batch, None), or (None, token budget) when `name` splits by tokens."""
        micro = self.phase(name).micro
        return (None, micro.value) if micro.by_tokens else (micro.value, None)

    def setting(self, key: str) -> int | None:
        """The value of a micro-batch or token budget key; None when no phase splits by it."""
        return next((p.micro.value for p in self.phases if p.micro is not None and p.micro.key == key), None)

    def with_micro(self, values: dict[str, int]) -> "PlanInputs":
        """The same inputs with micro-batches or token budgets set by config key, as StepPlan.with_micro
        sets them (a budget key switches its phase to tokens); `auto_micro_batch`'s picks apply as they are."""
        return replace(self, phases=swap_micro(self.phases, values))

    @property
    def gen_rows(self) -> int:
        """Responses one rank generates in one round (config/plan.py gen_per_rank_responses)."""
        return self.gen_responses_per_rank or self.responses_per_rank

    @property
    def gen_micro(self) -> int:
        """Sequences the engine decodes together (rollout.max_num_seqs)."""
        return self.phase("generate").micro.value

    @property
    def packed(self) -> bool:
        """use_remove_padding: micro-batches hold their rows' real tokens only, so a token budget
        bounds their memory whatever the lengths (models/packing.py)."""
        return self.packing is not None

    @property
    def width(self) -> int:
        """Padded sequence length of every micro-batch: the longest prompt plus the response cap."""
        return self.prompt_len + self.response_len

    @property
    def reward_width(self) -> int:
        """Padded length of the reward model's rows: reward_model.max_length when it re-renders them
        (a row is cut to its last max_length tokens, and the planned lengths say nothing of another
        tokenizer's counts), else the actor's rows (validation keeps max_length >= their full width)."""
        return self.reward_rerender_len or self.width

    def worst_case(self) -> "PlanInputs":
        """The same inputs at full lengths: every prompt and response as long as the config allows."""
        return replace(self, prompt_len=self.max_prompt_len or self.prompt_len,
                       response_len=self.max_response_len or self.response_len)

    @property
    def master_bytes(self) -> int:
        """The trained actor's and critic's stored weights, gradients and AdamW states: fp32 under a
        narrower compute dtype (models/loading.py master_dtype)."""
        return max(self.dtype_bytes, 4)

    @property
    def uses_ref(self) -> bool:
        return self.skipped("ref") is None

    @property
    def uses_reward_model(self) -> bool:
        return self.reward_spec is not None and self.skipped("reward_model") is None

    @classmethod
    def from_plan(cls, plan: StepPlan, cfg: DictConfig, spec: ModelSpec, device: str,
                  critic_spec: ModelSpec | None = None, **what_if) -> "PlanInputs":
        arr, critic = cfg[ARR], cfg.critic
        dtype = arr.model.dtype
        dtype_bytes = DTYPE_BYTES[dtype] if dtype != "auto" else (2 if device == "cuda" else 4)
        rm = cfg.reward_model
        # A reward_spec what-if plans the phase even where the config has no reward model.
        skip_rm = None if what_if.get("reward_spec") is not None else plan.phase("reward_model").skipped
        if skip_rm is None and what_if.get("reward_spec") is None:
            # Its shape from its checkpoint's config.json (validate.py checked it is there).
            what_if["reward_spec"] = load_model_spec(rm.model.path)
        if "base_weight_bits" not in what_if:
            what_if.update(quantized_base(cfg, spec, dtype_bytes))
        if "reward_rerender_len" not in what_if and skip_rm is None and rerenders(cfg):
            what_if["reward_rerender_len"] = rm.max_length or cfg.data.max_prompt_length + cfg.data.max_response_length
        return cls(
            spec=spec, critic_spec=(critic_spec or spec) if plan.critic else None, device=device,
            dtype_bytes=dtype_bytes, world=plan.ranks,
            prompt_len=cfg.data.max_prompt_length, response_len=cfg.data.max_response_length,
            responses_per_rank=plan.per_rank_responses, gen_responses_per_rank=plan.gen_per_rank_responses,
            phases=tuple(replace(p, skipped=skip_rm) if p.name == "reward_model" else p for p in plan.phases),
            actor_per_rank_mini=plan.actor.per_rank_mini,
            actor_ckpt=arr.model.enable_gradient_checkpointing, actor_offload=arr.actor.fsdp_config.param_offload,
            lora_rank=arr.model.lora_rank, lora_sync=arr.rollout.lora_sync,
            lora_targets=lora_targets(arr.model.target_modules, spec.num_layers) if arr.model.lora_rank else (),
            ref_offload=arr.ref.fsdp_config.param_offload,
            critic_per_rank_mini=plan.critic.per_rank_mini if plan.critic else 1,
            critic_ckpt=critic.model.enable_gradient_checkpointing, critic_offload=critic.fsdp_config.param_offload,
            engine=arr.rollout.name,
            gpu_memory_utilization=arr.rollout.gpu_memory_utilization, kv_cache_gb=arr.rollout.kv_cache_gb,
            free_cache_engine=arr.rollout.free_cache_engine,
            max_num_batched_tokens=arr.rollout.max_num_batched_tokens,
            update_weights_bucket_mb=arr.rollout.update_weights_bucket_mb,
            actor_optim_offload=arr.actor.fsdp_config.optimizer_offload,
            critic_optim_offload=critic.fsdp_config.optimizer_offload,
            rollout_tp=arr.rollout.tensor_model_parallel_size,
            max_prompt_len=cfg.data.max_prompt_length, max_response_len=cfg.data.max_response_length,
            actor_grad_accum=plan.actor.grad_accumulation,
            critic_grad_accum=plan.critic.grad_accumulation if plan.critic else "unsharded",
            packing=packed_kernel(arr.model.use_remove_padding, device, dtype_bytes),
            critic_packing=packed_kernel(critic.model.use_remove_padding, device, dtype_bytes),
            reward_offload=rm.model.fsdp_config.param_offload,
            reward_packing=packed_kernel(rm.model.use_remove_padding, device, dtype_bytes),
            sequence_parallel=tuple((p.name, s) for p in plan.phases
                                    if p.skipped is None and (s := phase_sp_size(cfg, p.name)) > 1),
            **what_if)


def quantized_base(cfg: DictConfig, spec: ModelSpec, dtype_bytes: int) -> dict:
    """The PlanInputs fields of the actor's quantized base: none, NF4 on the fly, or a GPTQ checkpoint."""
    model = cfg[ARR].model
    if model.quantization == "nf4":
        bits = nf4_bits(model.quantization_block_size, model.quantization_scaler_block_size, dtype_bytes)
        return {"base_weight_bits": bits, "base_replicated": True, "engine_full_precision": True}
    if spec.quant_method and spec.quant_bits:
        bits = gptq_bits(spec.quant_bits, spec.quant_group_size or spec.hidden_size)
        return {"base_weight_bits": bits, "base_replicated": True}
    return {}


def rerenders(cfg: DictConfig) -> bool:
    """Whether the reward model re-renders the actor's rows with its own tokenizer (workers/hybrid.py
    `_load_reward_model`): reward_model.model.input_tokenizer is set and its tokenizer and the reward
    model's differ. A tokenizer that cannot be read here counts as different: the longer rows."""
    rm = cfg.reward_model
    if not rm.enable or rm.model.input_tokenizer is None:
        return False
    return _tokenizers_differ(str(rm.model.input_tokenizer), str(rm.model.path))


@functools.lru_cache(maxsize=8)  # auto_micro_batch and a sweep plan the same pair many times
def _tokenizers_differ(source: str, path: str) -> bool:
    # Here, not at the top: loading and rm_inputs import torch, which a plan without a re-rendering
    # reward model never needs.
    from logicrl.models.loading import checkpoint_dir, load_tokenizer
    from logicrl.models.rm_inputs import same_tokenizer

    # The embedded reward model is saved with the tiny tokenizer; reading it there does not build (train) it.
    source, path = (EMBEDDED_TINY if p == EMBEDDED_TINY_RM else p for p in (source, path))
    try:
        # A config-only directory (logicrl/memory/shapes/) may load as an empty tokenizer: ask for the files.
        if not all(any((checkpoint_dir(p) / f).is_file() for f in TOKENIZER_FILES) for p in (source, path)):
            return True
        return not same_tokenizer(load_tokenizer(source, quiet=True), load_tokenizer(path, quiet=True))
    except Exception:  # noqa: BLE001 - transformers raises many kinds for a broken tokenizer; the run will say
        return True
