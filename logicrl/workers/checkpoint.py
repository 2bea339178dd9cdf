"""Rank side of checkpoints: the FSDP2 model + optimizer + scheduler, and the HF export.

Every rank calls `save_sharded` / `load_sharded` on the same directory (the controller's tmp dir,
trainer/checkpoint.py): torch DCP writes each rank's own shards, so no rank holds the full state, and a
load may use another world size (DCP reshards). Scheduler and RNG states are JSON.

Nothing loaded here unpickles code: DCP's tensor files with weights_only=True, its `.metadata` pickle
through `_SafeFileSystemReader`, whose unpickler resolves only DCP's metadata dataclasses and torch's
plain value types. `export_hf` gathers one parameter at a time (weight_sync, LoRA merged) into
safetensors on rank 0; with LoRA also the adapter alone, in peft's format. The sharded state holds the
fp32 masters and AdamW states, so a resume continues from exactly the trained values; the export is in
the compute dtype (what the engine serves, at half the size), and nothing resumes from it.
"""

from __future__ import annotations

import enum
import json
import os
import pickle
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from logicrl.models.loading import checkpoint_dir
from logicrl.rng import capture_rng_state, restore_rng_state
from logicrl.workers.fsdp import full_tensor
from logicrl.workers.weight_sync import iter_engine_weights

SCHEDULER_FILE = "lr_scheduler.json"
META_FILE = "meta.json"
LORA_ADAPTER_DIR = "lora_adapter"  # verl's name for the adapter beside the merged export
SHARD_BYTES = 2 * 1024**3  # per safetensors file; HF's own default is 5 GB, smaller uploads and copies more easily
# Files of the source checkpoint that an export must not copy: we write our own weights and index.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".index.json")


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


# ---------------------------------------------------------------- safe DCP metadata
class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the plain-data classes DCP's metadata is made of; anything else is refused."""

    _TORCH_VALUES = {"Size", "device", "dtype", "layout", "memory_format"}

    def find_class(self, module: str, name: str):
        obj = None
        if module.startswith("torch.distributed.checkpoint."):
            obj = super().find_class(module, name)
            # Dataclasses and enums only: DCP's Metadata, TensorStorageMetadata, _StorageInfo, ...
            ok = isinstance(obj, type) and (hasattr(obj, "__dataclass_fields__") or issubclass(obj, enum.Enum))
            obj = obj if ok else None
        elif module == "torch" and (name in self._TORCH_VALUES or isinstance(getattr(torch, name, None), torch.dtype)):
            obj = getattr(torch, name)
        elif (module, name) in {("torch.serialization", "_get_layout"),  # maps "torch.strided" to the layout
                                ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"),  # StorageMeta's path
                                ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset"),
                                ("builtins", "slice"), ("builtins", "tuple"), ("builtins", "list"),
                                ("builtins", "dict")}:
            obj = super().find_class(module, name)
        if obj is None:
            raise pickle.UnpicklingError(f"checkpoint metadata names {module}.{name}, which is not plain data")
        return obj


class _SafeFileSystemReader(dcp.FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


# ---------------------------------------------------------------- model + optimizer + scheduler
def save_sharded(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler, trainable_only: bool = False) -> None:
    """Every rank: write its shards of `model` and `optimizer`, plus the scheduler (rank 0) and its RNG.

    `trainable_only` (for LoRA) skips frozen parameters: the base weights come back from
    actor_rollout_ref.model.path on load, so a checkpoint holds only the adapter and its optimizer.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    options = StateDictOptions(ignore_frozen_params=trainable_only)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=dcp.FileSystemWriter(directory))
    (directory / f"rng_rank{_rank()}.json").write_text(json.dumps(capture_rng_state()))
    if _rank() == 0:
        sched = scheduler.state_dict()
        # LambdaLR stores plain functions as None (they are rebuilt from config); a callable object
        # here would need pickle, so fail loudly at save time rather than at resume.
        (directory / SCHEDULER_FILE).write_text(json.dumps(sched))
        world = dist.get_world_size() if dist.is_initialized() else 1
        (directory / META_FILE).write_text(json.dumps({"trainable_only": trainable_only, "world_size": world}))
    _barrier()  # the controller commits after this returns on every rank: all files are written


def load_sharded(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 scheduler=None, restore_rng: bool = True) -> None:
    """Every rank: load what `save_sharded` wrote into the already sharded `model`, `optimizer`, `scheduler`.

    The optimizer must be built over the same parameters (same config); the world size may differ.
    `optimizer=None` loads the model weights alone (a curriculum stage's start, the reference model);
    `scheduler=None` leaves the scheduler as built (a new stage restarts its schedule).
    """
    directory = Path(directory)
    meta = json.loads((directory / META_FILE).read_text())
    options = StateDictOptions(ignore_frozen_params=meta["trainable_only"])
    if optimizer is None:
        model_sd = get_model_state_dict(model, options=options)
        state = {"model": model_sd}
        dcp.load(state, storage_reader=_SafeFileSystemReader(directory))  # reads only the keys asked for
        set_model_state_dict(model, state["model"], options=StateDictOptions(strict=not meta["trainable_only"]))
    else:
        # get_state_dict gives correctly sharded targets (and initialises empty optimizer state) to load into.
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, storage_reader=_SafeFileSystemReader(directory))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=not meta["trainable_only"]))
    if scheduler is not None:
        scheduler.load_state_dict(json.loads((directory / SCHEDULER_FILE).read_text()))
    rng = directory / f"rng_rank{_rank()}.json"
    if restore_rng and rng.is_file():  # absent when resuming on more ranks than saved: keep the seeded state
        restore_rng_state(json.loads(rng.read_text()))


def load_stage_start(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                     carry_optimizer: bool) -> None:
    """A curriculum stage's start: the previous stage's weights (and, if asked, its Adam moments).

    The lr comes from this stage's own schedule, not from the loaded param groups.
    """
    load_sharded(directory, model, optimizer if carry_optimizer else None, restore_rng=False)
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
        group["lr"] = lr


# ---------------------------------------------------------------- HF export
def _is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def _copy_source_files(source: Path, out_dir: Path) -> None:
    """config.json, tokenizer and generation config from the source checkpoint; never its weights."""
    for entry in source.iterdir():
        if entry.is_file() and not entry.name.endswith(_WEIGHT_SUFFIXES) and not entry.name.startswith("."):
            shutil.copy2(entry, out_dir / entry.name)


class _ShardWriter:
    """Buffers tensors up to `limit` bytes, then writes one safetensors file; names fixed at close."""

    def __init__(self, out_dir: Path, limit: int):
        self.out_dir, self.limit = out_dir, limit
        self.buffer: dict[str, torch.Tensor] = {}
        self.size = 0
        self.files: list[tuple[Path, list[str]]] = []
        self.total = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if self.buffer and self.size + nbytes > self.limit:
            self._flush()
        self.buffer[name] = tensor.detach().cpu().contiguous()
        self.size += nbytes
        self.total += nbytes

    def _flush(self) -> None:
        from safetensors.torch import save_file

        path = self.out_dir / f".shard-{len(self.files):05d}.partial"
        save_file(self.buffer, str(path), metadata={"format": "pt"})
        self.files.append((path, list(self.buffer)))
        self.buffer, self.size = {}, 0

    def close(self) -> None:
        if self.buffer or not self.files:
            self._flush()
        if len(self.files) == 1:
            os.replace(self.files[0][0], self.out_dir / "model.safetensors")
            return
        weight_map = {}
        n = len(self.files)
        for i, (path, names) in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(path, self.out_dir / final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {"total_size": self.total}, "weight_map": weight_map}
        (self.out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def export_hf(model: torch.nn.Module, out_dir: str | Path, source_path: str, merge_lora: bool = False,
              shard_bytes: int = SHARD_BYTES, dtype: torch.dtype | None = None) -> None:
    """Every rank: write `model` as a HF directory in `out_dir` (rank 0 writes; the others help gather).

    `source_path` is actor_rollout_ref.model.path: config.json and the tokenizer are copied from it.
    Without LoRA `out_dir` holds the full model. With LoRA the adapter goes to `out_dir/lora_adapter`
    (peft's save format, loadable with PeftModel.from_pretrained over the source model), and the
    merged full model goes to `out_dir` only when `merge_lora` (it is the size of the base model).
    Peak extra memory on rank 0 is one shard plus one gathered parameter. `dtype`: the weights' dtype
    in the export (None: as the model stores them); the adapter stays in its own (fp32).
    """
    out_dir = Path(out_dir)
    rank0 = _rank() == 0
    lora = _is_lora(model)
    if rank0:
        out_dir.mkdir(parents=True, exist_ok=True)
    if lora:
        _export_lora_adapter(model, out_dir / LORA_ADAPTER_DIR, source_path, rank0)
    if not lora or merge_lora:
        writer = _ShardWriter(out_dir, shard_bytes) if rank0 else None
        # Every rank iterates: each full_tensor() is a collective all-gather.
        for name, tensor in iter_engine_weights(model, dtype=dtype):
            if writer is not None:
                writer.add(name, tensor)
        if rank0:
            writer.close()
            _copy_source_files(checkpoint_dir(source_path), out_dir)
    _barrier()


def _export_lora_adapter(model: torch.nn.Module, out_dir: Path, source_path: str, rank0: bool) -> None:
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    # Gather only the adapter parameters (small); peft then maps names to its save format
    # (drops the adapter name, keeps the `base_model.model.` prefix it expects on load).
    gathered = {name: full_tensor(p).detach().cpu().contiguous()
                for name, p in model.named_parameters() if ".lora_" in name}
    if not rank0:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    adapter = get_peft_model_state_dict(model, state_dict=gathered)
    save_file({k: v.contiguous() for k, v in adapter.items()}, str(out_dir / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    config = model.peft_config["default"]
    previous = config.base_model_name_or_path
    # Point the adapter at the real directory (the embedded tiny model's cache, or the user's path).
    config.base_model_name_or_path = str(checkpoint_dir(source_path).resolve())
    try:
        config.save_pretrained(str(out_dir))
    finally:
        config.base_model_name_or_path = previous
