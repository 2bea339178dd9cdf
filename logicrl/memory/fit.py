"""Does a plan fit the device, and if not, what to change: check_fit and auto_micro_batch.

Every knob is tried on the plan's own inputs (PlanInputs.with_micro by config key, PlanInputs.switch
for a model's switch by its key, dataclasses.replace for the engine's; nothing mutated) and only
suggested when it makes the failing phase fit; micro-batches and token budgets are suggested at the
largest value that fits, not halved blindly. Which key sizes a phase, and its budget and
use_dynamic_bsz keys, are the phase table's (config/phases.py); each model's switches, packing and
SP size are its row's in the model table (config/models.py). auto_micro_batch returns {key: value}
for StepPlan.with_micro.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from logicrl.config.engines import ENGINES
from logicrl.config.errors import ConfigError
from logicrl.config.models import MODELS
from logicrl.config.models import model as model_row
from logicrl.config.phases import BY_NAME, SIZED_PHASES, UPDATE_OF
from logicrl.memory.engine import footprint
from logicrl.memory.footprint import kv_bytes_per_token
from logicrl.memory.phases import GB
from logicrl.memory.planner import MemoryPlan, plan_inputs
from logicrl.memory.planner_inputs import KNOBS, PlanInputs

# The phases whose micro-batch or token budget is chosen here, in the order they are tried and the
# picks listed (config/phases.py: the policy's passes first).
SIZED = SIZED_PHASES


def _fits(x: PlanInputs, capacity: int, phases: Iterable[str]) -> bool:
    plan = plan_inputs(x, capacity)
    return all(plan.phase(p).skipped or plan.phase(p).total <= plan.usable for p in phases)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _even_splits(n: int) -> list[int]:
    """Forward-only micro-batch sizes worth trying for n rows: the smallest size for each number of
    passes (94 rows of 128 take two passes, as 64 do, at a higher peak)."""
    return sorted({-(-n // k) for k in range(1, n + 1)})


def _largest(x: PlanInputs, capacity: int, phases: tuple[str, ...], key: str, values: list[int]) -> int | None:
    """The largest of `values` (ascending) for micro-batch `key` with which all `phases` fit; None if none does."""
    fitting = [v for v in values if _fits(x.with_micro({key: v}), capacity, phases)]
    return fitting[-1] if fitting else None


def _budgets(x: PlanInputs, rows: int, width: int | None = None) -> list[int]:
    # A budget below one full row still gives each row its own micro-batch; above `rows` rows it
    # no longer splits anything. Whole rows of the padded width are the only distinct steps.
    return [k * (width or x.width) for k in range(1, rows + 1)]


def _update(phase: str) -> bool:
    """A training update: its micro-batches split the role's per-rank mini-batch (and must divide it)."""
    return BY_NAME[phase].backward


def _rows(x: PlanInputs, phase: str) -> int:
    """The rows `phase` splits on one rank: the role's mini-batch for an update, else every response."""
    if _update(phase):
        return x.models[BY_NAME[phase].model].per_rank_mini
    return x.responses_per_rank


def _sized(x: PlanInputs, phase: str) -> bool:
    """Whether `phase`'s size is chosen: generate unless the engine schedules its own batches (vLLM queues
    what its KV cache cannot hold), a model's phases when the plan has that model (the critic with gae, the
    reward model when on); the actor's and the reference's always."""
    model = BY_NAME[phase].model
    if model == "engine":
        return not ENGINES[x.engine].schedules_own_batches
    return x.models[model].spec is not None


def _size_knobs(x: PlanInputs) -> list[tuple[tuple[str, ...], str, list[int]]]:
    """(phases it decides, config key, candidate values) for each micro-batch or budget in use.

    Rows: the divisors of an update's mini-batch, or a forward's even splits. A key two phases share
    (critic.ppo_micro_batch_size_per_gpu sizes values and update_critic: workers/hybrid.py) is one knob,
    held to the update's divisors. Budgets: whole rows of the phase's padded width."""
    knobs: list[tuple[tuple[str, ...], str, list[int]]] = []
    for phase in SIZED:
        if not _sized(x, phase):
            continue
        micro, rows = x.phase(phase).micro, _rows(x, phase)
        if micro.by_tokens:
            values = _budgets(x, rows, _width(x, phase))
        else:
            values = _divisors(rows) if _update(phase) else _even_splits(rows)
        shared = next((i for i, (_, key, _) in enumerate(knobs) if key == micro.key), None)
        if shared is None:
            knobs.append(((phase,), micro.key, values))
        else:
            phases, key, before = knobs[shared]
            knobs[shared] = ((*phases, phase), key, values if _update(phase) else before)
    return knobs


def _flag_knobs(x: PlanInputs, phase: str) -> list[tuple[str, Callable[[PlanInputs], PlanInputs]]]:
    """On/off remedies that could lower `phase`, as (config key, the change), in the order they are
    suggested: checkpointing costs compute only, offload costs host transfers every step."""

    def on(key: str) -> tuple[str, Callable[[PlanInputs], PlanInputs]]:
        return key, lambda y: y.switch(key, True)

    # Checkpointing lowers a model's own update only.
    out = [on(role.ckpt_key) for role in MODELS
           if role.ckpt_key and phase == UPDATE_OF.get(role.name) and not x.models[role.name].ckpt]
    if x.device != "cuda":
        return out  # offload moves nothing off a CPU rank (workers/fsdp.py)
    # Optimizer offload first: it frees the states outside their update and keeps the step on the
    # GPU; parameter offload moves the step itself to the host.
    for role in MODELS:
        inputs = x.models[role.name]
        if (role.optim_offload_key and x.holds(role.name) and phase != UPDATE_OF.get(role.name)
                and not inputs.offload and not inputs.optim_offload):
            out.append(on(role.optim_offload_key))
    out += [on(role.offload_key) for role in MODELS if x.holds(role.name) and not x.models[role.name].offload]
    return out


def _runs(x: PlanInputs, phase: str) -> bool:
    return x.skipped(phase) is None and _sized(x, phase)


def _width(x: PlanInputs, phase: str) -> int:
    """The padded length of `phase`'s rows: the reward model's own (re-rendered) rows, or the actor's."""
    return x.reward_width if phase == "reward_model" else x.width


def _packed(x: PlanInputs, phase: str) -> bool:
    """Whether `phase` packs its rows: by its model's use_remove_padding (config/models.py)."""
    return x.models[BY_NAME[phase].model].packing is not None


def by_budget(x: PlanInputs, phase: str, budget: int) -> PlanInputs:
    """`x` with `phase` split by a token budget of `budget`."""
    return x.with_micro({BY_NAME[phase].budget_key: budget})


def any_length_budget(x: PlanInputs, capacity: int, phase: str) -> int | None:
    """The largest token budget with which `phase` fits at full lengths, in whole full-length rows; None
    if not even one row fits.

    With packed sequences a micro-batch holds at most the budget's real tokens (plus one row when a
    row is longer), however long or short its rows: a budget that fits full-length rows fits every
    length. Bisected: a larger budget never needs less memory.
    """
    worst = x.worst_case()
    rows = _rows(worst, phase)
    width = _width(worst, phase)
    lo, hi = 0, rows  # lo rows fit (0: none known), hi+1 do not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(by_budget(worst, phase, mid * width), capacity, (phase,)):
            lo = mid
        else:
            hi = mid - 1
    return lo * width if lo else None


def auto_micro_batch(x: PlanInputs, capacity: int) -> dict[str, int]:
    """Config overrides setting every micro-batch / token budget to the largest value that fits.

    Knobs already at that value are left out; a knob whose phase cannot fit even at its smallest
    value keeps its configured value (check_fit then names the other remedies). With packed
    sequences (x.packed) every phase that can split by tokens gets the largest budget that fits at
    full lengths instead of a micro-batch (a budget key in place of a row key means use_dynamic_bsz:
    StepPlan.with_micro): it bounds memory whatever the lengths, and packs more short rows per pass.
    Each phase follows its own model's use_remove_padding (config/models.py).
    """
    overrides: dict[str, int] = {}
    chosen: set[str] = set()
    if any(inputs.packing is not None for inputs in x.models.values()):
        # The reward model's last: its picks are listed after the trained models'.
        budgeted = sorted((p for p in SIZED if BY_NAME[p].budgeted), key=lambda p: BY_NAME[p].model == "reward_model")
        for phase in budgeted:
            if _packed(x, phase) and _runs(x, phase) and (best := any_length_budget(x, capacity, phase)) is not None:
                key = BY_NAME[phase].budget_key
                chosen.add(key)
                if best != x.setting(key):
                    overrides[key] = best
        x = x.with_micro(overrides)
    for phases, key, values in _size_knobs(x):
        if key in chosen:
            continue
        best = _largest(x, capacity, phases, key, values)
        if best is not None and best != x.setting(key):
            overrides[key] = best
    return overrides


def worst_phase(plan: MemoryPlan):
    """The running phase furthest over the usable memory, or None when all fit."""
    over = [p for p in plan.running() if p.total > plan.usable]
    return max(over, key=lambda p: p.total) if over else None


def remedies(plan: MemoryPlan) -> list[tuple[str, object]]:
    """(config key, value) changes that each, alone, make the worst phase fit: the largest smaller
    micro-batch or budget first, then checkpointing, offload, and vLLM's memory fraction."""
    worst, x = worst_phase(plan), plan.inputs
    if worst is None:
        return []
    fixes: list[tuple[str, object]] = []
    for phases, key, values in _size_knobs(x):
        if worst.name in phases:
            smaller = [v for v in values if v < x.setting(key)]
            best = _largest(x, plan.capacity, phases, key, smaller)
            if best is not None:
                fixes.append((key, best))
    for key, change in _flag_knobs(x, worst.name):
        if _fits(change(x), plan.capacity, (worst.name,)):
            fixes.append((key, True))
    # The engine's share of the device bounds generate, and a sync received beside the awake engine (a rollout
    # group's: memory/groups.py).
    if worst.name in ("generate", "update_weights") and footprint(x).kv_from_utilization(x):
        util = _largest_utilization(x, plan.capacity, worst.name)
        if util is not None:
            fixes.append((KNOBS["gpu_memory_utilization"], util))
    return fixes


def _show(value) -> str:
    return "true" if value is True else f"{value:.2f}" if isinstance(value, float) else str(value)


class DoesNotFit(ConfigError):
    """The memory plan refuses the config: a phase needs more than the device has. `knobs` are the
    settings the message names (a sweep's summary lists them)."""

    def __init__(self, message: str, knobs: list[str], plan: MemoryPlan):
        super().__init__(message)
        self.knobs = knobs
        self.peaks_gb = {p.name: round(p.total / GB, 3) for p in plan.running()}


def check_fit(plan: MemoryPlan, capacity_gb: float | None = None, auto: bool = False) -> None:
    """Raise ConfigError for the phase furthest over the device, naming the knobs that make it fit.

    capacity_gb: check against another device size than the plan's (the plan is redone for it,
    since vLLM's KV cache on CUDA is a fraction of the device). auto: the plan is auto_micro_batch's
    (its micro-batches the largest that fit), so a sequence-parallel size is named without a micro-batch.
    """
    if capacity_gb is not None and int(capacity_gb * GB) != plan.capacity:
        plan = plan_inputs(plan.inputs, int(capacity_gb * GB))
    worst = worst_phase(plan)
    if worst is None:
        _check_kv_room(plan)
        return
    over = [p for p in plan.running() if p.total > plan.usable]
    others = f" ({len(over) - 1} other phase(s) too)" if len(over) > 1 else ""
    need = f"{worst.name} needs {worst.total / GB:.1f} GB > {plan.usable / GB:.1f} GB usable per device{others}"
    fixes = remedies(plan)
    budget, budget_keys = budget_remedy(plan)
    sp = sp_remedy(plan, auto)
    if fixes:
        also, sp_keys = (f"; or {sp}", [sp.split("=")[0].removeprefix("set ")]) if sp else ("", [])
        raise DoesNotFit(f"{need}: set {' or '.join(f'{k}={_show(v)}' for k, v in fixes)}{budget}{also}",
                         [k for k, _ in fixes] + budget_keys + sp_keys, plan)
    if sp is not None:
        width = _width(plan.inputs, worst.name)
        raise DoesNotFit(f"{need}: a {width:,}-token row does not fit at any micro-batch on one device; {sp}",
                         [sp.split("=")[0].removeprefix("set "), "trainer.n_gpus"], plan)
    if worst.name == "reward_model":
        # The reward model is frozen: LoRA on the actor changes nothing of it; its rows' length does.
        x = plan.inputs
        shorten, keys = ("reward_model.max_length (its re-rendered rows' length)", [KNOBS["reward_max_length"]]) \
            if x.reward_rerender_len else ("data.max_prompt_length / data.max_response_length",
                                           ["data.max_response_length"])
        raise DoesNotFit(f"{need}, and no single reward_model micro-batch or offload setting makes it fit{budget}: "
                         f"combine them, shard over more devices (trainer.n_gpus), shorten {shorten}, or use a "
                         f"smaller reward model (reward_model.model.path)",
                         ["trainer.n_gpus", *keys, "reward_model.model.path"] + budget_keys, plan)
    raise DoesNotFit(f"{need}, and no single micro-batch, checkpointing or offload setting makes it fit{budget}: "
                      f"combine them, shard over more devices (trainer.n_gpus), shorten data.max_prompt_length / "
                      f"data.max_response_length, or train LoRA adapters (actor_rollout_ref.model.lora_rank)",
                     ["trainer.n_gpus", "data.max_response_length", "actor_rollout_ref.model.lora_rank"] + budget_keys,
                     plan)


def sp_remedy(plan: MemoryPlan, auto: bool = False) -> str | None:
    """For a packed phase that no micro-batch makes fit: the smallest sequence-parallel size (a divisor of
    the ranks that the model's heads allow, config/sequence_parallel.py) with which it fits at one row per
    micro-batch (or a one-row budget), as "set <key>=S (...)", the key its model's row names; None when none
    does. The one-row setting is named beside it unless configured already, or `auto`
    (trainer.auto_micro_batch picks it at that size)."""
    worst, x = worst_phase(plan), plan.inputs
    model = BY_NAME[worst.name].model
    # SP splits packed rows only, in a phase that splits them (not the weight sync)
    if model not in x.models or x.models[model].packing is None or x.phase(worst.name).micro is None:
        return None
    spec, key = x.models[model].spec, model_row(model).sp_key
    row = BY_NAME[worst.name]
    by_tokens = x.phase(worst.name).micro.by_tokens
    smallest = {row.budget_key: _width(x, worst.name)} if by_tokens else {row.rows_key: 1}
    for s in _divisors(x.world):
        if s <= x.sp_of(worst.name) or spec.num_heads % s or spec.num_kv_heads % s and s % spec.num_kv_heads:
            continue
        split = dict(x.sequence_parallel)
        split.update({p.name: s for p in x.phases if BY_NAME[p.name].model == model})
        y = replace(x, sequence_parallel=tuple(split.items())).with_micro(smallest)
        if _fits(y, plan.capacity, (worst.name,)):
            (what, value), = smallest.items()
            micro = f" with {what}={value}" if x.setting(what) != value and not auto else ""
            return f"set {key}={s} (Ulysses sequence parallelism: each row's tokens split over {s} ranks){micro}"
    return None


def budget_remedy(plan: MemoryPlan) -> tuple[str, list[str]]:
    """(", or the token budget that fits at any length: ..." for the refusal, its keys), or ("", []) when
    the worst phase cannot split by tokens, or not even one full-length row fits it.

    Named in either planning mode, beside the micro-batch: the budget is worked out at full lengths,
    so with packed sequences it holds however long the responses grow. Padded rows keep their full
    width whatever the budget (workers/micro.py), so there it also needs use_remove_padding.
    """
    worst, x = worst_phase(plan), plan.inputs
    if worst is None or not BY_NAME[worst.name].budgeted:
        return "", []
    budget = any_length_budget(x, plan.capacity, worst.name)
    if budget is None:
        return "", []
    row = BY_NAME[worst.name]
    keys = [row.dynamic_key, row.budget_key]
    setting = f"{keys[0]}=true {keys[1]}={budget}"
    if not _packed(x, worst.name):
        padding = model_row(row.model).packing_key
        keys.append(padding)
        setting += f" {padding}=true"
    rows = budget // _width(x.worst_case(), worst.name)
    return (f"; or the token budget that fits at any length ({rows} full-length row{'s' if rows > 1 else ''}): "
            f"{setting}", keys)


def stop_lengths(plan: MemoryPlan) -> dict[str, int | None]:
    """For each running phase, the response length at which it stops fitting (the first that does not),
    or None when it fits up to the full response length: the plan bisected over the response length,
    every other input as planned. Needs a plan that fits at its own response length."""
    x, limit = plan.inputs, plan.usable
    top = x.max_response_len or x.response_len
    out: dict[str, int | None] = {}
    for phase in plan.running():
        def fits(length: int, name: str = phase.name) -> bool:
            return plan_inputs(replace(x, response_len=length), plan.capacity).phase(name).total <= limit

        if fits(top):
            out[phase.name] = None
            continue
        lo, hi = x.response_len, top  # fits at lo, not at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        out[phase.name] = hi
    return out


def _largest_utilization(x: PlanInputs, capacity: int, phase: str = "generate") -> float | None:
    """The largest vLLM memory fraction (in steps of 0.05) that fits `phase`, with room for one sequence."""
    for step in range(int(x.gpu_memory_utilization * 20) - 1, 0, -1):
        y = replace(x, gpu_memory_utilization=step / 20)
        if _fits(y, capacity, (phase,)) and plan_inputs(y, capacity).phase("generate").parts["kv_cache"] > 0:
            return step / 20
    return None


def _check_kv_room(plan: MemoryPlan) -> None:
    """An engine that reserves its KV cache at start (vLLM) refuses to start when it cannot hold one
    sequence of the full length."""
    x = plan.inputs
    if not footprint(x).preallocates_kv or plan.phase("generate").skipped:
        return
    kv = plan.phase("generate").parts["kv_cache"]
    one = kv_bytes_per_token(x.spec, x.dtype_bytes) * x.width
    if kv >= one:
        return
    key = KNOBS["gpu_memory_utilization"] if footprint(x).kv_from_utilization(x) else KNOBS["kv_cache_gb"]
    raise DoesNotFit(f"generate: {ENGINES[x.engine].label}'s KV cache ({kv / GB:.2f} GB) cannot hold one "
                     f"sequence of {x.width} tokens ({one / GB:.2f} GB): raise {key}, or shorten "
                     "data.max_response_length",
                     [key, "data.max_response_length"], plan)
