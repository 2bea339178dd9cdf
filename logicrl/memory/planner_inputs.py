"""What the memory planner reads from the step plan and a validated config, as one frozen record.

The planner works on this record, not on the config, so `auto_micro_batch` can try other
micro-batch sizes (`PlanInputs.with_micro`, by config key) or switches (`PlanInputs.switch` by config
key, `dataclasses.replace`) and nothing is mutated. Batch sizes, each phase's split and which phases
run are the step plan's own `PhasePlan`s (config/plan.py); the config gives only what the plan does not
hold (dtype, offload, checkpointing, the engine's settings). Each FSDP2 model's facts are one
`ModelInputs`, read through its row of the model table (config/models.py), whose keys are also the
switches a suggestion sets; `KNOBS` names the engine's; micro-batch, token budget and use_dynamic_bsz
keys are the phase table's (config/phases.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from omegaconf import DictConfig

from logicrl.config.models import MODELS, ModelRole
from logicrl.config.phases import phase as phase_row
from logicrl.config.plan import ARR, PhasePlan, StepPlan, swap_micro
from logicrl.config.sequence_parallel import phase_sp_size
from logicrl.memory.footprint import lora_targets
from logicrl.memory.lengths import TOKENIZER_FILES
from logicrl.models.attention import packed_kernel
from logicrl.models.quant_methods import gptq_bits, nf4_bits
from logicrl.models.spec import ModelSpec, load_model_spec
from logicrl.models.tiny import EMBEDDED_TINY, EMBEDDED_TINY_RM

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# The engine's settings suggestions may set, by the PlanInputs field each stands for (reward_max_length
# has none: it is only named in refusals). The models' switches are their rows' keys (SWITCHES).
KNOBS = {
    "gpu_memory_utilization": f"{ARR}.rollout.gpu_memory_utilization",
    "kv_cache_gb": f"{ARR}.rollout.kv_cache_gb",
    "reward_max_length": "reward_model.max_length",
}
# The on/off switches of a model a suggestion may turn on: its ModelInputs field, by its row's key field.
SWITCHES = {"offload": "offload_key", "optim_offload": "optim_offload_key", "ckpt": "ckpt_key"}


@dataclass(frozen=True)
class ModelInputs:
    """One FSDP2 model's facts for the plan: its shape and the switches of its row in config/models.py."""

    spec: ModelSpec | None  # None: the run holds no such model (no critic without gae, no reward model)
    # use_remove_padding: None (padded) or the packed kernel's attn_implementation (models/attention.py
    # packed_kernel: "flash_attention_2" or "logicrl_packed_sdpa", neither with a mask)
    packing: str | None = None
    offload: bool = False  # param_offload: shards, gradients and the AdamW step on the host (CUDA only)
    optim_offload: bool = False  # optimizer_offload: AdamW states on the host outside their update
    ckpt: bool = False  # gradient checkpointing
    # A trained model's update: responses per optimizer step on one rank, and fsdp_config.grad_accumulation:
    # "sharded", "unsharded" or "auto" (planner.py resolves it from memory).
    per_rank_mini: int = 1
    grad_accum: str = "unsharded"


def model_inputs(role: ModelRole, cfg: DictConfig, plan: StepPlan, spec: ModelSpec | None, device: str,
                 dtype_bytes: int) -> ModelInputs:
    """`role`'s ModelInputs: its switches from the config by its row's keys, its update from the step plan."""
    update = plan.update(role.name)
    return ModelInputs(spec=spec, packing=packed_kernel(role.get(cfg, "packing_key"), device, dtype_bytes),
                       offload=bool(role.get(cfg, "offload_key")),
                       optim_offload=bool(role.get(cfg, "optim_offload_key")), ckpt=bool(role.get(cfg, "ckpt_key")),
                       per_rank_mini=update.per_rank_mini if update else 1,
                       grad_accum=update.grad_accumulation if update else "unsharded")


@dataclass(frozen=True)
class PlanInputs:
    # Each FSDP2 model's, by its name in config/models.py (the reference's shape is the actor's); never
    # changed in place (with_model, switch).
    models: dict[str, ModelInputs]
    device: str  # "cuda" or "cpu": decides the dtype under "auto", and whether offload means anything
    dtype_bytes: int  # the compute dtype (model.dtype): activations, gathered parameters, the engine, the ref
    world: int  # FSDP ranks: every rank shards every model
    prompt_len: int
    response_len: int
    responses_per_rank: int
    # Every phase of the step plan: why it is skipped (None: it runs) and how it splits its rows. The reward
    # model's is planned whenever a reward_spec what-if is given, whatever the config says.
    phases: tuple[PhasePlan, ...]
    # the actor's adapters
    lora_rank: int
    lora_targets: tuple[str, ...]
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
    # Re-rendered rows (its tokenizer differs from the actor's: models/rm_inputs.py) are the reward model's
    # own tokens, up to reward_model.max_length each, whatever the actor's lengths: the plan takes that
    # length. 0: it scores the actor's rows as they are (width).
    reward_rerender_len: int = 0
    update_weights_bucket_mb: int = 0  # weight sync gathers buckets of at most this (0: one tensor at a time)
    rollout_tp: int = 1  # the engine's tensor parallelism (vLLM): each rank's engine holds 1/tp of the weights
    # Sequence lengths (memory/lengths.py): prompt_len / response_len above are what the plan is for;
    # worst_case plans data.max_prompt_length / max_response_length, kept here for what must hold at
    # any length (a token budget) and for the response-length bisection (fit.stop_lengths).
    plan_mode: str = "worst_case"
    lengths_note: str = ""
    max_prompt_len: int = 0  # 0: prompt_len is the full length
    max_response_len: int = 0
    # Responses one rank generates per round: responses_per_rank, or with dynamic sampling
    # (algorithm.filter_groups) data.gen_batch_size's share (0: responses_per_rank).
    gen_responses_per_rank: int = 0
    # Ulysses sequence parallelism (models/ulysses.py): (phase, S) for each phase whose model has S > 1
    sequence_parallel: tuple[tuple[str, int], ...] = ()
    # Separate device groups (actor_rollout_ref.hybrid_engine=false): "trainer" or "rollout" plans that group's
    # devices alone (for_group); "" a colocated rank, which holds both.
    group: str = ""

    @property
    def spec(self) -> ModelSpec:
        """The policy's shape: the actor's, the reference's and the engine's."""
        return self.models["actor"].spec

    def holds(self, role: str) -> bool:
        """Whether the ranks hold `role`'s model, sharded, beside the others: its shape is known and a phase
        of it runs, unless it is the reference under LoRA (the actor with its adapter off)."""
        if self.models[role].spec is None or (role == "ref" and self.lora_rank):
            return False
        return any(p.skipped is None for p in self.phases if phase_row(p.name).model == role)

    def with_model(self, role: str, **changes) -> PlanInputs:
        """The same inputs with `role`'s ModelInputs fields changed."""
        return replace(self, models={**self.models, role: replace(self.models[role], **changes)})

    def switch(self, key: str, value: bool) -> PlanInputs:
        """The same inputs with every model whose row has `key` as a switch (SWITCHES) set to `value`."""
        changed = {role.name: replace(self.models[role.name], **{field: value})
                   for role in MODELS for field, key_field in SWITCHES.items() if getattr(role, key_field) == key}
        if not changed:
            raise KeyError(f"{key} is no model's switch (config/models.py)")
        return replace(self, models={**self.models, **changed})

    def for_group(self, group: str, ranks: int) -> PlanInputs:
        """The inputs of one device group of a split run, `ranks` devices each: the other group's phases are
        skipped (generate is the rollout group's, the models' phases the trainer group's; update_weights runs
        on both, a send and a receive). The rollout group's engine never sleeps (workers/rollout_worker.py)."""
        def skipped(p: PhasePlan) -> str | None:
            ours = p.name == "update_weights" or (phase_row(p.name).model == "engine") == (group == "rollout")
            return p.skipped if p.skipped or ours else _elsewhere(group)

        engine = {"free_cache_engine": False} if group == "rollout" else {}
        phases = tuple(replace(p, skipped=skipped(p)) for p in self.phases)
        return replace(self, group=group, world=ranks, phases=phases, **engine)

    def elsewhere(self, name: str) -> bool:
        """Whether `name` runs on the other device group, not on this one's (for_group)."""
        return bool(self.group) and self.skipped(name) == _elsewhere(self.group)

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

    def with_micro(self, values: dict[str, int]) -> PlanInputs:
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
        """The policy's use_remove_padding: micro-batches hold their rows' real tokens only, so a token
        budget bounds their memory whatever the lengths (models/packing.py)."""
        return self.models["actor"].packing is not None

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

    def worst_case(self) -> PlanInputs:
        """The same inputs at full lengths: every prompt and response as long as the config allows."""
        return replace(self, prompt_len=self.max_prompt_len or self.prompt_len,
                       response_len=self.max_response_len or self.response_len)

    @property
    def master_bytes(self) -> int:
        """The trained actor's and critic's stored weights, gradients and AdamW states: fp32 under a
        narrower compute dtype (models/loading.py master_dtype)."""
        return max(self.dtype_bytes, 4)

    @classmethod
    def from_plan(cls, plan: StepPlan, cfg: DictConfig, spec: ModelSpec, device: str,
                  critic_spec: ModelSpec | None = None, reward_spec: ModelSpec | None = None,
                  **what_if) -> PlanInputs:
        """The inputs of a validated config and its step plan. `critic_spec` (the actor's shape unless
        given) and `reward_spec` are what-ifs: a reward_spec plans the reward model's phase even where the
        config has none, split as reward_model's keys say; `what_if` sets other fields."""
        arr = cfg[ARR]
        dtype = arr.model.dtype
        dtype_bytes = DTYPE_BYTES[dtype] if dtype != "auto" else (2 if device == "cuda" else 4)
        rm = cfg.reward_model
        skip_rm = None if reward_spec is not None else plan.phase("reward_model").skipped
        if skip_rm is None and reward_spec is None:
            # Its shape from its checkpoint's config.json (validate.py checked it is there).
            reward_spec = load_model_spec(rm.model.path)
        if "base_weight_bits" not in what_if:
            what_if.update(quantized_base(cfg, spec, dtype_bytes))
        if "reward_rerender_len" not in what_if and skip_rm is None and rerenders(cfg):
            what_if["reward_rerender_len"] = rm.max_length or cfg.data.max_prompt_length + cfg.data.max_response_length
        specs = {"actor": spec, "ref": spec, "critic": (critic_spec or spec) if plan.critic else None,
                 "reward_model": reward_spec}
        return cls(
            models={m.name: model_inputs(m, cfg, plan, specs[m.name], device, dtype_bytes) for m in MODELS},
            device=device, dtype_bytes=dtype_bytes, world=plan.ranks,
            prompt_len=cfg.data.max_prompt_length, response_len=cfg.data.max_response_length,
            responses_per_rank=plan.per_rank_responses, gen_responses_per_rank=plan.gen_per_rank_responses,
            phases=tuple(replace(p, skipped=skip_rm) if p.name == "reward_model" else p for p in plan.phases),
            lora_rank=arr.model.lora_rank, lora_sync=arr.rollout.lora_sync,
            lora_targets=lora_targets(arr.model.target_modules, spec.num_layers) if arr.model.lora_rank else (),
            engine=arr.rollout.name,
            gpu_memory_utilization=arr.rollout.gpu_memory_utilization, kv_cache_gb=arr.rollout.kv_cache_gb,
            free_cache_engine=arr.rollout.free_cache_engine,
            max_num_batched_tokens=arr.rollout.max_num_batched_tokens,
            update_weights_bucket_mb=arr.rollout.update_weights_bucket_mb,
            rollout_tp=arr.rollout.tensor_model_parallel_size,
            max_prompt_len=cfg.data.max_prompt_length, max_response_len=cfg.data.max_response_length,
            sequence_parallel=tuple((p.name, s) for p in plan.phases
                                    if p.skipped is None and (s := phase_sp_size(cfg, p.name)) > 1),
            **what_if)


def _elsewhere(group: str) -> str:
    return f"on the {'rollout' if group == 'trainer' else 'trainer'} group"


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
    """Whether the reward model re-renders the actor's rows with its own tokenizer (workers/build.py
    `build_reward_model`): reward_model.model.input_tokenizer is set and its tokenizer and the reward
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
