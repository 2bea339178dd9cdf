"""The rollout engines: one row of traits per `actor_rollout_ref.rollout.name`, and which engine runs.

    row = ENGINES["vllm"]; row.tensor_parallel, row.schedules_own_batches, ...
    used = resolve_engine("vllm", tp=1)   # vllm, or its fallback (hf) where vLLM does not import, and why

Code asks a row for a trait instead of comparing names; the schema's choices are this table's keys. A row
names its memory footprint (memory/engine.py) and its builder (workers/rollout/engines.py) as
"module:name", since both live in packages above config/: adding an engine is its row, its engine and
builder under workers/rollout/, and a footprint. An NF4 base (model.quantization) reaches every engine
dequantized, in the compute dtype; `prequantized` is about checkpoints that are int4 on disk.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib import import_module

from logicrl.config.errors import ConfigError
from logicrl.config.phases import ARR


@dataclass(frozen=True)
class EngineRow:
    label: str  # how a message names it ("vLLM")
    package: str | None  # the module it imports beyond logicrl's own dependencies (None: none)
    install: str  # how to install that package, for the line saying it is missing
    fallback: str | None  # the engine that runs where `package` does not import (None: the run is refused)
    tensor_parallel: bool  # one engine over rollout.tensor_model_parallel_size ranks, 1/tp of the weights each
    # What sleep() releases on CUDA with rollout.free_cache_engine: 1, the KV cache freed and the weights
    # offloaded to the host; 2, both discarded (the next full sync reloads them). (): nothing to release.
    sleep_levels: tuple[int, ...]
    adapter_sync: bool  # takes LoRA's A/B tensors alone each sync (rollout.lora_sync=adapters)
    max_lora_rank: int | None  # the largest adapter rank its adapter sync takes (None: any)
    adapters_on_linears_only: bool  # its adapter sync covers the decoder's Linear layers, not embeddings or lm_head
    prequantized: tuple[str, ...]  # pre-quantized checkpoint formats it holds as the trainer does (int4 Linears)
    # It queues what its KV cache cannot hold (rollout.max_num_seqs, max_num_batched_tokens bound its own
    # batches): nothing for the planner to size or the OOM retry to halve. False: it decodes
    # rollout.max_num_seqs sequences at a time, a micro-batch like any other phase's.
    schedules_own_batches: bool
    returns_logprobs: bool  # each sampled token's log-prob (workers/rollout/base.py), read by rollout correction
    footprint: str  # "module:name" of its memory footprint (memory/engine.py EngineFootprint)
    builder: str  # "module:name" of the function that builds it on a rank (workers/rollout/engines.py)


# In the order refusals list them; vllm, the default, first.
ENGINES: dict[str, EngineRow] = {
    "vllm": EngineRow(
        label="vLLM", package="vllm", install="pip install -e '.[cpu]' or '.[gpu]'", fallback="hf",
        tensor_parallel=True, sleep_levels=(1, 2), adapter_sync=True,
        max_lora_rank=512,  # the largest of vLLM 0.32's MaxLoRARanks (rollout/vllm_lora.py rounds up to one)
        adapters_on_linears_only=True, prequantized=(), schedules_own_batches=True, returns_logprobs=True,
        footprint="logicrl.memory.engine:VLLM", builder="logicrl.workers.rollout.engines:build_vllm"),
    "hf": EngineRow(
        label="hf", package=None, install="", fallback=None,
        tensor_parallel=False, sleep_levels=(), adapter_sync=True, max_lora_rank=None,
        adapters_on_linears_only=False, prequantized=("gptq",), schedules_own_batches=False, returns_logprobs=True,
        footprint="logicrl.memory.engine:HF", builder="logicrl.workers.rollout.engines:build_hf"),
}


def engines_with(trait: str) -> list[str]:
    """The engines whose row has `trait` true (or non-empty), for a refusal's "use one of these"."""
    return [name for name, row in ENGINES.items() if getattr(row, trait)]


def load(ref: str):
    """The object a row names as "module:name" (its footprint or builder), imported on first use."""
    module, _, name = ref.partition(":")
    return getattr(import_module(module), name)


@dataclass(frozen=True)
class ResolvedEngine:
    """The engine a run uses: `requested` (rollout.name) unless its package is unusable here (`reason`),
    then `name` is its fallback; with no fallback `name` stays `requested` and the run cannot start."""

    name: str
    requested: str
    reason: str | None = None
    tp: int = 1

    @property
    def runs(self) -> bool:
        return self.reason is None or self.name != self.requested

    @property
    def line(self) -> str:
        """One line saying what runs instead and why (or why nothing can)."""
        key, row = f"{ARR}.rollout.name", ENGINES[self.requested]
        if not self.runs:
            return f"{key}={self.requested} but {self.reason}: install it, or set {key} to another engine"
        also = ""
        if self.tp > 1 and not ENGINES[self.name].tensor_parallel:
            also = f" (each rank holding the whole model: tensor_model_parallel_size={self.tp} needs {row.label})"
        return f"{key}={self.requested} but {self.reason}: generating with {self.name} instead{also}"


def resolve_engine(name: str, tp: int = 1, depth: str = "import") -> ResolvedEngine:
    """The engine that runs for rollout.name=`name`: the one place its fallback is decided, by the
    preflight for the memory plan and by each rank's engine builder. `depth` is how far the package is
    tried (package_problem)."""
    if name not in ENGINES:
        raise ConfigError(f"{ARR}.rollout.name={name} is not one of: {', '.join(ENGINES)}")
    row = ENGINES[name]
    reason = package_problem(row, depth) if row.package else None
    if reason is None:
        return ResolvedEngine(name, name)
    return ResolvedEngine(row.fallback or name, name, reason, tp)


def package_problem(row: EngineRow, depth: str) -> str | None:
    """Why `row.package` cannot be used here, or None. depth "installed": found on the path, not imported
    (a dry run, which plans for wherever the run will go); "import": imported, as the ranks will (a
    launch; a broken install, say a CUDA wheel beside CPU torch, is on the path but fails to import)."""
    if importlib.util.find_spec(row.package) is None:
        return f"{row.label} is not installed ({row.install})"
    if depth == "installed":
        return None
    try:
        import_module(row.package)
    except Exception as err:  # noqa: BLE001 - whatever it raises, the engine cannot run here
        return f"importing {row.label} failed ({type(err).__name__}: {err})"
    return None
