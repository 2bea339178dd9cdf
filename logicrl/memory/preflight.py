"""The preflight entry point: the device's capacity, the plan's table, auto micro-batches, refusal.

    table, plan = preflight(cfg, spec, plan)   # raises ConfigError (main_ppo: exit 2) when it cannot fit

Runs after validation and before anything loads, so it imports no torch unless a GPU may be
present (nvidia-smi on PATH) and the capacity must be detected.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import warnings
from dataclasses import replace

from omegaconf import DictConfig, OmegaConf

from logicrl.config.errors import ConfigError
from logicrl.config.inputs import check_data, check_models
from logicrl.config.plan import ARR, StepPlan, token_key
from logicrl.memory.disk import check_directories
from logicrl.memory.fit import auto_micro_batch, check_fit, stop_lengths, worst_phase
from logicrl.memory.lengths import EXPECTED, plan_lengths
from logicrl.memory.phases import GB
from logicrl.memory.planner import HEADROOM_GB, format_table, plan_inputs
from logicrl.memory.planner_inputs import PlanInputs
from logicrl.models.spec import ModelSpec, load_model_spec


@functools.lru_cache(maxsize=1)
def _cuda_total_gb() -> tuple[float, str] | None:
    """(total memory of GPU 0 in GB, its name), or None without a usable GPU. Cached: torch's
    import is the slow part of a dry run."""
    if shutil.which("nvidia-smi") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return props.total_memory / GB, props.name


def visible_gpus() -> int:
    """CUDA devices this process can use; 0 without nvidia-smi (no torch import then)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# The oldest Linux driver each CUDA major release runs on (NVIDIA's CUDA release notes, "Minimum
# Required Driver Version"). PyPI's torch 2.13, the version logicrl pins, is a CUDA 13 build.
MIN_DRIVER = {13: 580, 12: 525, 11: 450}


def _nvidia_smi(*args: str) -> str:
    """nvidia-smi's output, or "" when it fails (no driver loaded) or hangs (a wedged GPU)."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout if out.returncode == 0 else ""


@functools.lru_cache(maxsize=1)
def _gpus_torch_cannot_use() -> tuple[int, str] | None:
    """(GPUs nvidia-smi lists, the driver version) when torch can use none of them; None when it can
    or none is listed. Cached: a curriculum asks once per stage."""
    if shutil.which("nvidia-smi") is None:
        return None
    listed = [line for line in _nvidia_smi("-L").splitlines() if line.startswith("GPU ")]
    if not listed:
        return None
    import torch

    # On a driver too old for its CUDA, torch says why in a warning on stderr; the one line below
    # says it instead.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if torch.cuda.is_available():
            return None
    driver = _nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader").strip().splitlines()
    return len(listed), (driver[0].strip() if driver else "unknown")


def unusable_gpus_problem(device: str, gpus: int, driver: str, torch_version: str, torch_cuda: str | None,
                          cuda_visible: str | None) -> str | None:
    """Why trainer.device=auto/cuda must not start when nvidia-smi lists `gpus` GPUs on `driver` that
    torch `torch_version` (built for CUDA `torch_cuda`, None for a CPU build) cannot use, or None.

    Not a fallback: with trainer.device=auto the run would train on the CPU while the GPUs sit idle."""
    if device == "cpu" or gpus == 0:
        return None
    seen = (f"trainer.device={device} but torch {torch_version} cannot use the {gpus} GPU(s) nvidia-smi lists "
            f"(driver {driver}, torch.version.cuda={torch_cuda})")
    on_purpose = "; or set trainer.device=cpu to train on the CPU on purpose"
    if torch_cuda is None:
        return f"{seen}: this torch is a CPU build, install the CUDA one (rm -rf .venv && make setup){on_purpose}"
    need = MIN_DRIVER.get(int(torch_cuda.split(".")[0]))
    major = driver.split(".")[0]
    if need and (not major.isdigit() or int(major) < need):
        return (f"{seen}: CUDA {torch_cuda} needs NVIDIA driver >= {need}; upgrade the driver, or install a torch "
                f"built for this driver's CUDA{on_purpose}")
    if cuda_visible is not None:
        return f"{seen}: check CUDA_VISIBLE_DEVICES={cuda_visible!r} (an empty value hides every GPU){on_purpose}"
    return f"{seen}: check the driver (nvidia-smi, dmesg) and that this user may open /dev/nvidia*{on_purpose}"


def check_gpus_usable(cfg: DictConfig) -> None:
    """GPUs that nvidia-smi lists but torch cannot use stop the run with one line, before the memory
    plan (which would plan for CPU RAM) and before Ray or a model starts. Dry runs too, unless they
    plan for trainer.gpu_memory_gb: that is for GPUs one does not have here yet."""
    t = cfg.trainer
    if t.device == "cpu" or (t.dry_run and OmegaConf.select(cfg, "trainer.gpu_memory_gb", default=None) is not None):
        return
    if (unusable := _gpus_torch_cannot_use()) is None:
        return
    import torch

    problem = unusable_gpus_problem(t.device, *unusable, torch.__version__, torch.version.cuda,
                                    os.environ.get("CUDA_VISIBLE_DEVICES"))
    if problem:
        raise ConfigError(problem)


def device_problem(device: str, ranks: int, nnodes: int, gpus: int) -> str | None:
    """Why trainer.device / trainer.n_gpus cannot run on a machine with `gpus` visible GPUs, or None."""
    if device == "cuda" and gpus == 0:
        return ("trainer.device=cuda but this machine has no usable CUDA GPU: use trainer.device=cpu (or auto), "
                "or run on a GPU node")
    per_node = ranks // nnodes
    if device != "cpu" and gpus and per_node > gpus:
        return (f"trainer.n_gpus={ranks} puts {per_node} rank(s) on this node but it has {gpus} visible GPU(s): "
                f"lower trainer.n_gpus to {gpus * nnodes}, or check CUDA_VISIBLE_DEVICES")
    return None


def check_device(cfg: DictConfig, plan: StepPlan) -> None:
    """The device asked for is here. Skipped in a dry run (planning for GPUs one does not have
    yet is what trainer.gpu_memory_gb is for) and when joining a Ray cluster (its own size is
    checked when joining: controller/cluster.check_room)."""
    if cfg.trainer.dry_run:
        return
    if cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS"):
        return
    if cfg.trainer.nnodes > 1:
        raise ConfigError(f"trainer.nnodes={cfg.trainer.nnodes} needs a Ray cluster of that many nodes, but none "
                          "is given: set trainer.ray_address to its head (slurm/train.sbatch does), or nnodes=1")
    # trainer.device=cpu needs no GPU count (and no torch import, which warns on a broken driver).
    gpus = 0 if cfg.trainer.device == "cpu" else visible_gpus()
    if problem := device_problem(cfg.trainer.device, plan.ranks, cfg.trainer.nnodes, gpus):
        raise ConfigError(problem)


def capacity(cfg: DictConfig) -> tuple[str, float, str]:
    """(device kind the plan is for, GB per device, where that number comes from).

    trainer.gpu_memory_gb plans for GPUs of that size (even on a machine without one, to check a
    config before renting them) unless trainer.device=cpu, where it is each CPU rank's budget.
    Otherwise: CUDA's total memory of the first GPU, or the machine's available RAM over the ranks.
    """
    t = cfg.trainer
    given = OmegaConf.select(cfg, "trainer.gpu_memory_gb", default=None)
    if given is not None:
        return ("cpu" if t.device == "cpu" else "cuda"), float(given), "trainer.gpu_memory_gb"
    gpu = None if t.device == "cpu" else _cuda_total_gb()
    if gpu is not None:
        return "cuda", gpu[0], f"detected: {gpu[1]}"
    import psutil

    free = psutil.virtual_memory().available / GB
    return "cpu", free / t.n_gpus, f"CPU: {free:.1f} GB of available RAM / {t.n_gpus} rank(s)"


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
    if x.engine == "vllm" and importlib.util.find_spec("vllm") is None:
        x = replace(x, engine="hf")  # engines.build_engine falls back the same way
    return x, int(cap_gb * GB), source


def preflight(cfg: DictConfig, spec: ModelSpec, plan: StepPlan) -> tuple[str, StepPlan]:
    """(the table to print, the step plan to run); raises ConfigError when a phase cannot fit, or
    when nvidia-smi lists GPUs that torch cannot use (check_gpus_usable).

    `cfg` is validated (logicrl.config.validate), `spec` its actor's ModelSpec and `plan` its step
    plan. With trainer.auto_micro_batch=true the returned plan has every micro-batch / token budget
    at the largest value that fits, and the table shows the plan with them; otherwise it is `plan`.
    """
    check_gpus_usable(cfg)
    x, cap, source = plan_for(cfg, spec, plan)
    picked: dict[str, int] = {}
    if cfg.trainer.auto_micro_batch:
        picked = auto_micro_batch(x, cap)
        x = x.with_micro(picked)
    by_rows = {token_key(p.micro.key) for p in plan.phases if p.micro is not None and not p.micro.by_tokens}
    memory = plan_inputs(x, cap)
    table = _table(memory, source, picked, by_rows)
    check_fit(memory)
    # The workers run the grad_accumulation the plan resolved ("auto": unsharded unless it does not fit).
    chosen = memory.inputs
    return table, plan.with_micro(picked).with_grad_accumulation(chosen.actor_grad_accum, chosen.critic_grad_accum)


def check_inputs(cfg: DictConfig, spec: ModelSpec, plan: StepPlan) -> None:
    """Everything a run reads or writes, checked before Ray or a model starts; raises BadInput.

    The device, the model directories and data files (config/inputs.py: a dry run skips what needs the
    tokenizer), and the directories the run writes, with room for a checkpoint (memory/disk.py).
    """
    # What needs no transformers import first (a second or so), then the tokenizer's checks.
    check_device(cfg, plan)
    check_data(cfg, None)
    check_directories(cfg, spec, plan)
    tokenizer = check_models(cfg, dry_run=cfg.trainer.dry_run)
    if tokenizer is not None:
        check_data(cfg, tokenizer)


def _table(plan, source: str, picked: dict[str, int], by_rows: set[str] = frozenset()) -> str:
    """The plan as printed: its mode and lengths first, then the table, then what was chosen and,
    in expected mode, where each phase stops fitting."""
    x = plan.inputs
    headroom = HEADROOM_GB[x.device]
    note = f", {source}" + (f"; {headroom:.0f} GB kept free" if headroom else "")
    lines = [f"memory plan: trainer.memory_plan={x.plan_mode}, {x.lengths_note}", format_table(plan, note)]
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


def planned_peaks_gb(cfg: DictConfig, spec: ModelSpec, plan: StepPlan) -> dict[str, float]:
    """Each running phase's planned peak per device in GB (a sweep's summary reports them)."""
    x, cap, _ = plan_for(cfg, spec, plan)
    return {p.name: round(p.total / GB, 3) for p in plan_inputs(x, cap).running()}
