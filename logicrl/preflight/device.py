"""The device a run asks for: the driver, the GPUs torch can use, and the memory each rank has.

    check_gpus_usable(cfg)            # GPUs nvidia-smi lists but torch cannot use: one line, no CPU fallback
    check_device(cfg, plan)           # trainer.device, n_gpus and nnodes against this machine
    device, gb, source = capacity(cfg)  # what the memory plan is made for

Nothing here imports torch unless nvidia-smi is on PATH, so a dry run on a CPU machine stays fast;
what needs torch is cached, since a curriculum asks once per stage.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import warnings

from omegaconf import DictConfig, OmegaConf

from logicrl.config.async_training import rollout_ranks
from logicrl.config.errors import ConfigError
from logicrl.config.plan import StepPlan
from logicrl.memory.phases import GB


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
    if plan.rollout_ranks and cfg.trainer.device != "cpu" and gpus and plan.ranks + plan.rollout_ranks > gpus:
        # Separate groups (config/async_training.py): each rank of either group has a GPU of its own.
        raise ConfigError(f"trainer.n_gpus={plan.ranks} trainer ranks + rollout.nnodes x rollout.n_gpus_per_node="
                          f"{plan.rollout_ranks} rollout ranks need {plan.ranks + plan.rollout_ranks} GPUs, but this "
                          f"machine has {gpus} visible: lower one of them, or check CUDA_VISIBLE_DEVICES")


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
    ranks = t.n_gpus + rollout_ranks(cfg)  # separate groups: the rollout ranks share this machine too
    return "cpu", free / ranks, f"CPU: {free:.1f} GB of available RAM / {ranks} rank(s)"
