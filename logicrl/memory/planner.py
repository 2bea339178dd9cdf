"""The preflight memory plan: peak bytes per device in each phase of a step, by component.

    plan = plan_memory(step_plan, cfg, spec, device="cuda", capacity_gb=80)
    print(format_table(plan, capacity_note=", trainer.gpu_memory_gb"))   # the note follows "capacity 80.0 GB"

It models what the code allocates (workers/hybrid.py and what it calls) in steady state, after the
first step, once AdamW's states exist: what each rank holds between phases (FSDP2 shards, fp32 masters
and AdamW states of the trained models, the frozen reference and reward model in the compute dtype,
the rollout engine's copy; offload moves them to the host) plus each phase's transients (phases.py).
docs/memory.md ("The model") lists every term. Forward-only passes reshard FSDP2's root unit
afterwards, so no gathered root is resident between phases. On separate groups (PlanInputs.group) a rank
holds one side: the engine alone (rollout) or the models alone (trainer); groups.py plans their sync.
Not modelled: allocator fragmentation, the CUDA context and NCCL buffers: HEADROOM_GB of each GPU is
kept free for them (MemoryPlan.usable, read by grad_accumulation's choice here and by fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from logicrl.config.engines import ENGINES
from logicrl.config.models import BY_NAME as MODEL_ROWS
from logicrl.config.models import MODELS, TRAINED
from logicrl.config.phases import UPDATE_OF, WORKER_PHASES
from logicrl.config.phases import phase as phase_row
from logicrl.config.plan import StepPlan
from logicrl.memory.engine import footprint
from logicrl.memory.footprint import ModelBytes, kv_bytes_per_token
from logicrl.memory.groups import GROUP_FOOTPRINTS
from logicrl.memory.phases import (
    COMPONENTS,
    FOOTPRINTS,
    GB,
    Models,
    PhaseMemory,
    backward_phase,
    base_once,
    forward_phase,
    micro_batches,
)
from logicrl.memory.planner_inputs import ModelInputs, PlanInputs
from logicrl.models.attention import KERNEL_NOTES
from logicrl.models.spec import ModelSpec

# Kept free on a GPU for what the plan does not model: the CUDA context, NCCL buffers and the
# caching allocator's fragmentation. On CPU the capacity is already what the OS says is free.
HEADROOM_GB = {"cuda": 1.0, "cpu": 0.0}


def usable_bytes(capacity: int, device: str) -> int:
    """What a phase may use of `capacity` bytes per device: all of it but the headroom."""
    return capacity - int(HEADROOM_GB[device] * GB)


@dataclass
class MemoryPlan:
    inputs: PlanInputs
    phases: list[PhaseMemory]
    capacity: int  # bytes per device the plan is checked against
    notes: list[str]
    # The adapter sync over an NF4 base: the engine sent the dequantized base once, at build (a moment
    # before the first step, not a step's phase: phases.base_once); None where none is sent.
    base_once: PhaseMemory | None = None

    @property
    def usable(self) -> int:
        """Bytes per device a phase may use: the capacity less HEADROOM_GB."""
        return usable_bytes(self.capacity, self.inputs.device)

    def phase(self, name: str) -> PhaseMemory:
        return next(p for p in self.phases if p.name == name)

    def running(self) -> list[PhaseMemory]:
        return [p for p in self.phases if not p.skipped]


def build_models(x: PlanInputs) -> Models:
    b, w, master = x.dtype_bytes, x.world, x.master_bytes
    # With LoRA the frozen base stays in the compute dtype (workers/hybrid.py); the adapters are fp32
    # masters gathered in the compute dtype (footprint.py).
    actor = ModelBytes.build(x.spec, dtype_bytes=b, world=w, lora_rank=x.lora_rank, lora_targets_=x.lora_targets,
                             base_weight_bits=x.base_weight_bits, master_bytes=b if x.lora_rank else master,
                             base_replicated=x.base_replicated)
    # The others as their rows say: trained ones keep fp32 masters, frozen ones the compute dtype.
    others = {role.name: ModelBytes.build(x.models[role.name].spec, dtype_bytes=b, world=w,
                                          head="value" if role.value_head else "lm",
                                          master_bytes=master if role.trains else None)
              if x.holds(role.name) else None for role in MODELS if role.name != "actor"}
    # The engine's copy of a quantized base: 4-bit when it loads a pre-quantized checkpoint, the compute
    # dtype when it loaded the bf16 one and takes the dequantized weights (quantization=nf4).
    engine_bits = None if x.engine_full_precision else x.base_weight_bits
    engine = ModelBytes.build(x.spec, dtype_bytes=b, world=1, base_weight_bits=engine_bits)
    return Models(actor=actor, engine=engine, **others)


def _on_device(x: PlanInputs, offload: bool) -> bool:
    # workers/fsdp.py: parameter offload only applies with an accelerator.
    return not (offload and x.device == "cuda")


def loaded_states(x: PlanInputs, model: ModelBytes, inputs: ModelInputs) -> int:
    """AdamW state bytes that optimizer_offload brings to the device for the model's update, and
    takes back after it (workers/update.py); 0 when they never leave (or, with param_offload, never
    reach) the device."""
    on_device = _on_device(x, inputs.offload) and not _on_device(x, inputs.optim_offload)
    return 2 * model.trainable_shard if on_device else 0


def resident(x: PlanInputs, m: Models) -> tuple[int, int]:
    """(parameter bytes, AdamW state bytes) every rank holds on the device between phases."""
    params = optim = 0
    for role in MODELS:
        model, inputs = getattr(m, role.name), x.models[role.name]
        if model is None or not _on_device(x, inputs.offload):
            continue
        params += model.total_shard
        if role.trains:
            optim += 2 * model.trainable_shard - loaded_states(x, model, inputs)
    return params, optim


def runs_on(x: PlanInputs, m: Models, role: str) -> ModelBytes | None:
    """The model a phase of `role` runs: the ranks' own; for a reference under LoRA the actor with its
    adapter off; None where the ranks hold none."""
    if role == "ref" and m.ref is None and x.skipped("ref") is None:
        return m.actor
    return getattr(m, role)


def phase_memory(name: str, x: PlanInputs, m: Models, base: dict[str, int], capacity: int) -> PhaseMemory:
    """Phase `name`'s peak: its own footprint (FOOTPRINTS), else a forward or a training update of its
    model as its row in config/phases.py says. A phase of a model the ranks do not hold is skipped."""
    row = phase_row(name)
    role = MODEL_ROWS.get(row.model)
    model = runs_on(x, m, row.model) if role else None
    if role and model is None:
        return PhaseMemory(name, skipped=x.skipped(name) or f"no {role.title}")
    own = {**FOOTPRINTS, **GROUP_FOOTPRINTS.get(x.group, {})}  # a device group's own sync (groups.py)
    if name in own:
        phase = own[name](x, m, base, capacity)
    elif role is None:
        raise KeyError(f"phase {name!r} runs on {row.model!r}, no model of config/models.py: give it a footprint "
                       "(memory/phases.py FOOTPRINTS)")
    elif row.backward:
        inputs = x.models[row.model]
        # optimizer_offload's states, loaded for their update
        states = {**base, "optimizer": base["optimizer"] + loaded_states(x, model, inputs)}
        phase = backward_phase(name, x, model, inputs.spec, states, *x.split(name), inputs.per_rank_mini,
                               inputs.ckpt, lm=not role.value_head, offload=inputs.offload,
                               sharded_grads=inputs.grad_accum == "sharded", packing=inputs.packing)
    else:
        inputs = x.models[row.model]
        phase = forward_phase(name, x, model, inputs.spec, base, *x.split(name), lm=not role.value_head,
                              packing=inputs.packing)
    phase.skipped = x.skipped(name)
    return phase


def plan_inputs(x: PlanInputs, capacity: int) -> MemoryPlan:
    """The per-phase plan; `capacity` (bytes per device) also sizes vLLM's KV cache on CUDA.
    A grad_accumulation of "auto" is resolved first (resolve_grad_accumulation)."""
    x = resolve_grad_accumulation(x, capacity)
    m = build_models(x)
    # On separate groups the rollout ranks hold only the engine, the trainer ranks no engine.
    params, optim = resident(x, m) if x.group != "rollout" else (0, 0)
    weights, kv = footprint(x).resident(x, m.engine, capacity, awake=False) if x.group != "trainer" else (0, 0)
    base = dict(params=params, optimizer=optim, engine=weights, kv_cache=kv)
    # One list of phase names (config/phases.py): the table's rows are the metrics' perf/memory/<phase>.
    phases = [phase_memory(name, x, m, base, capacity) for name in WORKER_PHASES]
    notes = _notes(x, m, phases[0])
    once = base_once(x, m, base, capacity) if not x.group else None
    if once is not None:
        usable = usable_bytes(capacity, x.device)
        notes.append(f"the engine is sent the dequantized 4-bit base once, at build, awake: {once.total / GB:.1f} GB "
                     f"at that moment ({'fits' if once.total <= usable else 'over the usable'} "
                     f"{usable / GB:.1f} GB); each step's sync then moves only the adapters")
    return MemoryPlan(inputs=x, phases=phases, capacity=capacity, notes=notes, base_once=once)


def resolve_grad_accumulation(x: PlanInputs, capacity: int) -> PlanInputs:
    """`x` with each role's grad_accumulation "auto" made "unsharded" when that role's update fits
    the device so (one collective per mini-batch instead of one per micro-batch: faster,
    benchmarks/grad_accumulation.py), else "sharded". One rank has nothing to shard: unsharded."""
    autos = [role for role in TRAINED if x.models[role].grad_accum == "auto"]
    if not autos:
        return x
    # Each update's footprint depends only on its own role's mode: one unsharded plan decides both.
    plan = plan_inputs(_with_grad_accum(x, dict.fromkeys(autos, "unsharded")), capacity)
    usable = usable_bytes(capacity, x.device)

    def fits(phase: PhaseMemory) -> bool:
        return x.world == 1 or bool(phase.skipped) or phase.total <= usable

    return _with_grad_accum(x, {role: "unsharded" if fits(plan.phase(UPDATE_OF[role])) else "sharded"
                                for role in autos})


def _with_grad_accum(x: PlanInputs, modes: dict[str, str]) -> PlanInputs:
    for role, mode in modes.items():
        x = x.with_model(role, grad_accum=mode)
    return x


def _notes(x: PlanInputs, m: Models, generate: PhaseMemory) -> list[str]:
    notes = []
    if footprint(x).preallocates_kv and not generate.skipped:
        one = kv_bytes_per_token(x.spec, x.dtype_bytes) * x.width
        fits = generate.parts["kv_cache"] // one
        notes.append(f"{ENGINES[x.engine].label}'s KV cache holds {fits} sequences of {x.width} tokens at once; this "
                     f"rank generates {x.gen_rows} (more queue, they do not fail)")
    actor = x.models["actor"]
    steps = micro_batches(x, *x.split("update_actor"), actor.per_rank_mini)
    if x.world > 1 and steps > 1 and not x.skipped("update_actor"):
        if actor.grad_accum == "sharded":
            notes.append(f"update_actor accumulates {steps} micro-batches sharded (grad_accumulation): "
                         f"{m.actor.trainable_shard / GB:.2f} GB of gradients per rank, one reduce-scatter per "
                         "micro-batch")
        else:
            notes.append(f"update_actor accumulates {steps} micro-batches without gradient sync: FSDP2 then keeps "
                         f"the gradient unsharded, {m.actor.trainable_full / GB:.2f} GB per rank instead of "
                         f"{m.actor.trainable_shard / GB:.2f} (grad_accumulation=sharded)")
    return notes


def plan_memory(step_plan: StepPlan, cfg: DictConfig, spec: ModelSpec, *, device: str, capacity_gb: float,
                critic_spec: ModelSpec | None = None, **what_if) -> MemoryPlan:
    """The plan for a validated config and its step plan on `device` ("cuda" or "cpu") with
    `capacity_gb` per device."""
    x = PlanInputs.from_plan(step_plan, cfg, spec, device, critic_spec, **what_if)
    return plan_inputs(x, int(capacity_gb * GB))


def attention_line(plan: MemoryPlan) -> str:
    """Which attention each model's micro-batches run on (models/attention.py packed_kernel), as planned."""
    x = plan.inputs

    def kernel(packing: str | None) -> str:
        if packing is None:
            return "padded (sdpa, a [T, T] padding mask per row)"
        return f"packed on {packing} ({KERNEL_NOTES[packing]})"

    # One entry per use_remove_padding key (the actor and the reference share theirs), for the models
    # with a phase that runs.
    keys: dict[str, list[str]] = {}
    for role in MODELS:
        keys.setdefault(role.packing_key, []).append(role.name)
    groups: dict[str | None, list[str]] = {}  # models on the same kernel share one description
    for roles in keys.values():
        if any(not p.skipped and phase_row(p.name).model in roles for p in plan.phases):
            who = "/".join(MODEL_ROWS[r].title for r in roles)
            groups.setdefault(x.models[roles[0]].packing, []).append(who)
    return "attention: " + "; ".join(f"{', '.join(who)} {kernel(packing)}" for packing, who in groups.items())


def format_table(plan: MemoryPlan, capacity_note: str = "") -> str:
    """One row per phase: each component and the total (GB, or MB for models under a GB), and the
    total's share of the device."""
    biggest = max((p.total for p in plan.running()), default=0)
    unit, scale = ("GB", GB) if biggest >= GB else ("MB", 2**20)
    short = {"optimizer": "optim", "activations": "activ", "logprob": "logits", "kv_cache": "kv"}
    header = f"{'phase':<15}" + "".join(f"{short.get(c, c):>9}" for c in COMPONENTS) + f"{'total':>9}{'of cap':>8}"
    lines = [f"memory plan per device ({unit}; capacity {plan.capacity / GB:.1f} GB{capacity_note})",
             *([attention_line(plan)] if plan.inputs.group != "rollout" else []), header]  # a rollout rank: no model
    for p in plan.phases:
        if p.skipped:
            lines.append(f"{p.name:<15}  skipped: {p.skipped}")
            continue
        cells = "".join(f"{p.parts[c] / scale:>9.2f}" for c in COMPONENTS)
        flag = "  > capacity" if p.total > plan.capacity else ""
        lines.append(f"{p.name:<15}{cells}{p.total / scale:>9.2f}{100 * p.total / plan.capacity:>7.0f}%{flag}")
    return "\n".join(lines + [f"note: {n}" for n in plan.notes])
