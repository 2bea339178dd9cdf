"""The memory preflight of one stage: its plan on this device, the table printed, refusal.

    planned = check_memory(cfg, spec, plan)   # raises DoesNotFit (main_ppo: exit 2) when a phase cannot fit
    planned.table, planned.plan, planned.peaks_gb

The plan is made once per stage and everything that needs its numbers reads this result: the
printed table, the step plan the workers run (trainer.auto_micro_batch's picks, the resolved
grad_accumulation), the checkpoint size the disk check needs, and the peaks a sweep reports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from omegaconf import DictConfig

from logicrl.config.engines import ENGINES, resolve_engine
from logicrl.config.errors import ConfigError
from logicrl.config.phases import BY_NAME
from logicrl.config.plan import ARR, StepPlan, token_key
from logicrl.errors import BadInput
from logicrl.memory.engine import footprint
from logicrl.memory.fit import auto_micro_batch, check_fit, stop_lengths, worst_phase
from logicrl.memory.lengths import EXPECTED, plan_lengths
from logicrl.memory.phases import GB
from logicrl.memory.planner import HEADROOM_GB, MemoryPlan, format_table, plan_inputs
from logicrl.memory.planner_inputs import PlanInputs
from logicrl.models.spec import ModelSpec, load_model_spec
from logicrl.preflight.device import capacity, check_gpus_usable

log = logging.getLogger("logicrl.preflight")


@dataclass(frozen=True)
class StagePlan:
    """One stage's memory plan, as decided before anything loads."""

    table: str  # the plan as printed: mode and lengths, the table, auto_micro_batch's picks
    plan: StepPlan  # the step plan to run: picked micro-batches, resolved grad_accumulation
    memory: MemoryPlan  # the planner's result the table shows (inputs, peak bytes per phase): the trainer group's
    # A dry run's refusals, in the order a launch meets them: main_ppo says them after the plan (exit 2).
    refusals: tuple[BadInput, ...] = ()
    # Separate groups (hybrid_engine=false): the trainer group's plan (`memory`) and the rollout group's.
    rollout: MemoryPlan | None = None

    @property
    def peaks_gb(self) -> dict[str, float]:
        return peaks_gb(self.memory, *[self.rollout] if self.rollout else [])


def peaks_gb(*memory: MemoryPlan) -> dict[str, float]:
    """Each running phase's planned peak per device in GB (a sweep's summary reports them); with two groups
    the higher of the two for a phase both run (update_weights)."""
    peaks: dict[str, float] = {}
    for plan in memory:
        for p in plan.running():
            peaks[p.name] = max(peaks.get(p.name, 0.0), round(p.total / GB, 3))
    return peaks


def plan_for(cfg: DictConfig, spec: ModelSpec, plan: StepPlan, **what_if):
    """The memory plan's inputs for a validated config and its step plan on this machine (or on
    trainer.gpu_memory_gb GPUs), the capacity in bytes, and where that number comes from."""
    device, cap_gb, source = capacity(cfg)
    critic_spec = None
    if plan.critic and cfg.critic.model.path != cfg[ARR].model.path:
        critic_spec = load_model_spec(cfg.critic.model.path)
    x = PlanInputs.from_plan(plan, cfg, spec, device, critic_spec, **what_if)
    lengths = plan_lengths(cfg, x.packed)
    x = replace(x, prompt_len=min(lengths.prompt, x.prompt_len), response_len=lengths.response,
                plan_mode=cfg.trainer.memory_plan, lengths_note=lengths.note)
    # The engine each rank will build (workers/rollout/engines.py asks the same function). A dry run plans
    # for wherever the run will go: it only looks for the package, and plans an engine without a fallback
    # even where its package is missing. A launch imports the package here, as every rank will next
    # (vLLM: seconds, and half a GB this process keeps).
    dry = cfg.trainer.dry_run
    engine = resolve_engine(x.engine, x.rollout_tp, "installed" if dry else "import")
    if not engine.runs:
        if not dry:
            raise ConfigError(engine.line)
        log.warning(f"{engine.line} (a launch here would refuse it; the plan is for where it is installed)")
    if engine.runs and engine.reason:
        log.warning(engine.line)
        x = replace(x, engine=engine.name)
    return x, int(cap_gb * GB), source


def check_memory(cfg: DictConfig, spec: ModelSpec, plan: StepPlan) -> StagePlan:
    """The stage's memory plan; raises ConfigError when a phase cannot fit, or when nvidia-smi lists
    GPUs that torch cannot use (check_gpus_usable).

    `cfg` is validated (logicrl.config.validate), `spec` its actor's ModelSpec and `plan` its step
    plan. With trainer.auto_micro_batch=true the returned plan has every micro-batch / token budget
    at the largest value that fits, and the table shows the plan with them; otherwise it is `plan`.
    Separate groups (plan.rollout_ranks) are planned group by group (_check_groups).
    """
    check_gpus_usable(cfg)
    x, cap, source = plan_for(cfg, spec, plan)
    if plan.rollout_ranks:
        return _check_groups(cfg, plan, x, cap, source)
    picked: dict[str, int] = {}
    if cfg.trainer.auto_micro_batch:
        picked = auto_micro_batch(x, cap)
        x = x.with_micro(picked)
    by_rows = {token_key(p.micro.key) for p in plan.phases if p.micro is not None and not p.micro.by_tokens}
    memory = plan_inputs(x, cap)
    table = _table(memory, source, picked, by_rows)
    refusals = [ConfigError(line) for line in plan.launch_refusals]  # validation's come first at a launch
    try:
        check_fit(memory, auto=cfg.trainer.auto_micro_batch)
    except ConfigError as err:
        if not cfg.trainer.dry_run:
            raise
        refusals.append(err)  # a dry run prints the plan that does not fit, then this
    # The workers run the grad_accumulation the plan resolved ("auto": unsharded unless it does not fit).
    chosen = memory.inputs
    modes = {role: inputs.grad_accum for role, inputs in chosen.models.items()}
    step_plan = plan.with_micro(picked).with_grad_accumulation(modes)
    return StagePlan(table, step_plan, memory, tuple(refusals))


def _check_groups(cfg: DictConfig, plan: StepPlan, x: PlanInputs, cap: int, source: str) -> StagePlan:
    """check_memory for separate groups: each group planned, sized and checked on its own devices (the
    engine's micro-batch chosen on the rollout group, the models' on the trainer group), both tables printed."""
    groups = {"trainer": x.for_group("trainer", plan.ranks), "rollout": x.for_group("rollout", plan.rollout_ranks)}
    picked: dict[str, dict[str, int]] = {}
    for group, inputs in groups.items():
        picks = auto_micro_batch(inputs, cap) if cfg.trainer.auto_micro_batch else {}
        # Each group sizes only the phases it runs: the other group's "fit" at any size here.
        ours = _keys(inputs)
        picked[group] = {k: v for k, v in picks.items() if k in ours}
    every = {**picked["trainer"], **picked["rollout"]}
    by_rows = {token_key(p.micro.key) for p in plan.phases if p.micro is not None and not p.micro.by_tokens}
    memory = {group: plan_inputs(inputs.with_micro(every), cap) for group, inputs in groups.items()}
    table = "\n".join(_group_title(cfg, group, memory[group]) + "\n" + _table(memory[group], source, picked[group],
                                                                           by_rows) for group in ("trainer", "rollout"))
    refusals = [ConfigError(line) for line in plan.launch_refusals]
    for group in ("trainer", "rollout"):
        try:
            check_fit(memory[group], auto=cfg.trainer.auto_micro_batch)
        except ConfigError as err:
            err.args = (f"the {group} group: {err}", *err.args[1:])
            if not cfg.trainer.dry_run:
                raise
            refusals.append(err)
    modes = {role: inputs.grad_accum for role, inputs in memory["trainer"].inputs.models.items()}
    step_plan = plan.with_micro(every).with_grad_accumulation(modes)
    return StagePlan(table, step_plan, memory["trainer"], tuple(refusals), rollout=memory["rollout"])


def _keys(x: PlanInputs) -> set[str]:
    """The micro-batch and token budget keys of the phases x's group runs (PlanInputs.for_group)."""
    keys: set[str] = set()
    for p in x.phases:
        if p.micro is not None and not x.elsewhere(p.name):
            keys |= {p.micro.key, *([BY_NAME[p.name].budget_key] if BY_NAME[p.name].budgeted else [])}
    return keys


def _group_title(cfg: DictConfig, group: str, memory: MemoryPlan) -> str:
    """The line above a group's table: its devices and what they hold."""
    x, where = memory.inputs, cfg[group]  # verl's keys: trainer.* and the top-level rollout.*
    devices = f"{x.world} device(s) ({group}.nnodes={where.nnodes} x {group}.n_gpus_per_node={where.n_gpus_per_node})"
    if group == "trainer":
        return f"== trainer group, {devices}: the FSDP2 models, their optimizer and activations; no engine, no KV cache"
    kv = ("its KV cache from rollout.gpu_memory_utilization of the whole device" if footprint(x).kv_from_utilization(x)
          else "its KV cache as the engine sizes it")
    return f"== rollout group, {devices}: the engine only ({ENGINES[x.engine].label}; {kv}), no FSDP model or optimizer"


def _table(plan, source: str, picked: dict[str, int], by_rows: set[str] = frozenset()) -> str:
    """The plan as printed: its mode and lengths first, then the table, then what was chosen and,
    in expected mode, where each phase stops fitting."""
    x = plan.inputs
    headroom = HEADROOM_GB[x.device]
    note = f", {source}" + (f"; {headroom:.0f} GB kept free" if headroom else "")
    lines = [f"memory plan: trainer.memory_plan={x.plan_mode}, {x.lengths_note}", format_table(plan, note)]
    if x.sequence_parallel:  # Ulysses: these phases' activations are planned per rank's share of each row
        lines.append("sequence parallelism (Ulysses): " + ", ".join(f"{p} splits each row over {s} ranks"
                                                                     for p, s in x.sequence_parallel))
    if picked:
        # A budget key for a phase that split by rows switches it to tokens (StepPlan.with_micro).
        lines.append("auto_micro_batch: " + " ".join(
            f"{k}={v}" + (" (use_dynamic_bsz: packed, a budget bounds memory at any length)" if k in by_rows else "")
            for k, v in picked.items()))
    if x.plan_mode == EXPECTED and worst_phase(plan) is None:
        lines.append(_stop_line(plan))
    return "\n".join(lines)


def _stop_line(plan) -> str:
    """Where the expected plan stops holding, per phase, and what covers the run past it."""
    x = plan.inputs
    top = x.max_response_len or x.response_len
    if not x.packed:
        return (f"expected lengths: responses are padded to data.max_response_length={top} columns (no packing), "
                "so the plan holds at any response length")
    stops = stop_lengths(plan)
    failing = [f"{name} at {length}" for name, length in stops.items() if length is not None]
    if not failing:
        return f"expected lengths: every phase fits up to data.max_response_length={top} as planned"
    holding = [name for name, length in stops.items() if length is None]
    return (f"expected lengths: stops fitting at response length {', '.join(failing)} tokens"
            + (f" ({', '.join(holding)} fit up to {top})" if holding else "")
            + "; past that the run relies on token budgets and OOM recovery (workers/oom.py halves the micro-batch)")
