"""The preflight memory plan: peak bytes per device in each phase of a step, by component.

    plan = plan_memory(step_plan, cfg, spec, device="cuda", capacity_gb=80)
    print(format_table(plan, capacity_note=", trainer.gpu_memory_gb"))   # the note follows "capacity 80.0 GB"

It models what the code allocates (workers/hybrid.py and what it calls) in steady state, after the
first step, once AdamW's states exist: what each rank holds between phases (FSDP2 shards, fp32 masters
and AdamW states of the trained models, the frozen reference and reward model in the compute dtype,
the rollout engine's copy; offload moves them to the host) plus each phase's transients (phases.py).
docs/memory.md ("The model") lists every term. Forward-only passes reshard FSDP2's root unit
afterwards, so no gathered root is resident between phases.
Not modelled: allocator fragmentation, the CUDA context and NCCL buffers: HEADROOM_GB of each GPU is
kept free for them (MemoryPlan.usable, read by grad_accumulation's choice here and by fit.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from omegaconf import DictConfig

from logicrl.config.engines import ENGINES
from logicrl.config.plan import WORKER_PHASES, StepPlan
from logicrl.memory.engine import footprint
from logicrl.memory.footprint import ModelBytes, kv_bytes_per_token
from logicrl.memory.planner_inputs import PlanInputs
from logicrl.memory.phases import (
    COMPONENTS,
    GB,
    Models,
    PhaseMemory,
    backward_phase,
    base_once,
    forward_phase,
    generate_phase,
    micro_batches,
    reward_model_phase,
    weight_sync_phase,
)
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
    ref = ModelBytes.build(x.spec, dtype_bytes=b, world=w) if x.uses_ref and not x.lora_rank else None
    critic = ModelBytes.build(x.critic_spec, dtype_bytes=b, world=w, head="value",
                              master_bytes=master) if x.critic_spec else None
    reward = ModelBytes.build(x.reward_spec, dtype_bytes=b, world=w, head="value") if x.uses_reward_model else None
    # The engine's copy of a quantized base: 4-bit when it loads a pre-quantized checkpoint, the compute
    # dtype when it loaded the bf16 one and takes the dequantized weights (quantization=nf4).
    engine_bits = None if x.engine_full_precision else x.base_weight_bits
    engine = ModelBytes.build(x.spec, dtype_bytes=b, world=1, base_weight_bits=engine_bits)
    return Models(actor, ref, critic, reward, engine)


def _on_device(x: PlanInputs, offload: bool) -> bool:
    # workers/fsdp.py: parameter offload only applies with an accelerator.
    return not (offload and x.device == "cuda")


def loaded_states(x: PlanInputs, model: ModelBytes, param_offload: bool, optim_offload: bool) -> int:
    """AdamW state bytes that optimizer_offload brings to the device for the model's update, and
    takes back after it (workers/update.py); 0 when they never leave (or, with param_offload, never
    reach) the device."""
    return 2 * model.trainable_shard if _on_device(x, param_offload) and not _on_device(x, optim_offload) else 0


def resident(x: PlanInputs, m: Models) -> tuple[int, int]:
    """(parameter bytes, AdamW state bytes) every rank holds on the device between phases."""
    params = optim = 0
    if _on_device(x, x.actor_offload):
        params += m.actor.total_shard
        optim += 2 * m.actor.trainable_shard - loaded_states(x, m.actor, x.actor_offload, x.actor_optim_offload)
    if m.critic and _on_device(x, x.critic_offload):
        params += m.critic.total_shard
        optim += 2 * m.critic.trainable_shard - loaded_states(x, m.critic, x.critic_offload, x.critic_optim_offload)
    if m.ref and _on_device(x, x.ref_offload):
        params += m.ref.total_shard
    if m.reward and _on_device(x, x.reward_offload):
        params += m.reward.total_shard
    return params, optim


def plan_inputs(x: PlanInputs, capacity: int) -> MemoryPlan:
    """The per-phase plan; `capacity` (bytes per device) also sizes vLLM's KV cache on CUDA.
    A grad_accumulation of "auto" is resolved first (resolve_grad_accumulation)."""
    x = resolve_grad_accumulation(x, capacity)
    m = build_models(x)
    params, optim = resident(x, m)
    weights, kv = footprint(x).resident(x, m.engine, capacity, awake=False)
    base = dict(params=params, optimizer=optim, engine=weights, kv_cache=kv)

    def with_states(states: int) -> dict[str, int]:  # optimizer_offload's states, loaded for their update
        return {**base, "optimizer": optim + states}

    ref_is_actor = x.uses_ref and m.ref is None  # LoRA: the actor with its adapter disabled
    phases = [generate_phase(x, m, base, capacity)]
    if m.reward:  # the reward model scores the responses like a frozen value model
        phases.append(reward_model_phase(x, m.reward, base))
    else:
        phases.append(PhaseMemory("reward_model", skipped=x.skipped("reward_model") or "no reward model"))

    old = forward_phase("old_log_prob", x, m.actor, x.spec, base, *x.split("old_log_prob"), lm=True,
                        packing=x.packing)
    old.skipped = x.skipped("old_log_prob")
    phases.append(old)

    if not x.uses_ref:
        phases.append(PhaseMemory("ref", skipped=x.skipped("ref")))
    else:
        phases.append(forward_phase("ref", x, m.actor if ref_is_actor else m.ref, x.spec, base, *x.split("ref"),
                                    lm=True, packing=x.packing))

    if m.critic:
        phases.append(forward_phase("values", x, m.critic, x.critic_spec, base, *x.split("values"), lm=False,
                                    packing=x.critic_packing))
        states = loaded_states(x, m.critic, x.critic_offload, x.critic_optim_offload)
        phases.append(backward_phase("update_critic", x, m.critic, x.critic_spec, with_states(states),
                                     *x.split("update_critic"), x.critic_per_rank_mini, x.critic_ckpt,
                                     lm=False, offload=x.critic_offload, sharded_grads=x.critic_grad_accum == "sharded",
                                     packing=x.critic_packing))
    else:
        phases += [PhaseMemory(name, skipped=x.skipped(name)) for name in ("values", "update_critic")]

    states = loaded_states(x, m.actor, x.actor_offload, x.actor_optim_offload)
    phases.append(backward_phase("update_actor", x, m.actor, x.spec, with_states(states), *x.split("update_actor"),
                                 x.actor_per_rank_mini, x.actor_ckpt, lm=True, offload=x.actor_offload,
                                 sharded_grads=x.actor_grad_accum == "sharded", packing=x.packing))
    phases.append(weight_sync_phase(x, m, base, capacity))
    # One list of phase names (config/plan.py): the table's rows are the metrics' perf/memory/<phase>.
    assert [p.name for p in phases] == list(WORKER_PHASES)
    notes = _notes(x, m, phases[0])
    once = base_once(x, m, base, capacity)
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
    phases = {"actor_grad_accum": "update_actor", "critic_grad_accum": "update_critic"}
    autos = [field for field in phases if getattr(x, field) == "auto"]
    if not autos:
        return x
    # Each update's footprint depends only on its own role's mode: one unsharded plan decides both.
    plan = plan_inputs(replace(x, **dict.fromkeys(autos, "unsharded")), capacity)
    usable = usable_bytes(capacity, x.device)

    def fits(phase: PhaseMemory) -> bool:
        return x.world == 1 or bool(phase.skipped) or phase.total <= usable

    return replace(x, **{f: "unsharded" if fits(plan.phase(phases[f])) else "sharded" for f in autos})


def _notes(x: PlanInputs, m: Models, generate: PhaseMemory) -> list[str]:
    notes = []
    if footprint(x).preallocates_kv:
        one = kv_bytes_per_token(x.spec, x.dtype_bytes) * x.width
        fits = generate.parts["kv_cache"] // one
        notes.append(f"{ENGINES[x.engine].label}'s KV cache holds {fits} sequences of {x.width} tokens at once; this "
                     f"rank generates {x.gen_rows} (more queue, they do not fail)")
    steps = micro_batches(x, *x.split("update_actor"), x.actor_per_rank_mini)
    if x.world > 1 and steps > 1:
        if x.actor_grad_accum == "sharded":
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

    models = [("actor/ref", x.packing)]
    if not plan.phase("update_critic").skipped:
        models.append(("critic", x.critic_packing))
    if not plan.phase("reward_model").skipped:
        models.append(("reward model", x.reward_packing))
    groups: dict[str | None, list[str]] = {}  # models on the same kernel share one description
    for who, packing in models:
        groups.setdefault(packing, []).append(who)
    return "attention: " + "; ".join(f"{', '.join(who)} {kernel(packing)}" for packing, who in groups.items())


def format_table(plan: MemoryPlan, capacity_note: str = "") -> str:
    """One row per phase: each component and the total (GB, or MB for models under a GB), and the
    total's share of the device."""
    biggest = max((p.total for p in plan.running()), default=0)
    unit, scale = ("GB", GB) if biggest >= GB else ("MB", 2**20)
    short = {"optimizer": "optim", "activations": "activ", "logprob": "logits", "kv_cache": "kv"}
    header = f"{'phase':<15}" + "".join(f"{short.get(c, c):>9}" for c in COMPONENTS) + f"{'total':>9}{'of cap':>8}"
    lines = [f"memory plan per device ({unit}; capacity {plan.capacity / GB:.1f} GB{capacity_note})",
             attention_line(plan), header]
    for p in plan.phases:
        if p.skipped:
            lines.append(f"{p.name:<15}  skipped: {p.skipped}")
            continue
        cells = "".join(f"{p.parts[c] / scale:>9.2f}" for c in COMPONENTS)
        flag = "  > capacity" if p.total > plan.capacity else ""
        lines.append(f"{p.name:<15}{cells}{p.total / scale:>9.2f}{100 * p.total / plan.capacity:>7.0f}%{flag}")
    return "\n".join(lines + [f"note: {n}" for n in plan.notes])
