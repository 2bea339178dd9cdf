"""Rank side of checkpoints: the FSDP2 model + optimizer + scheduler (the HF export: hf_export.py).

Every rank calls `save_sharded` / `load_sharded` on the same directory (the controller's tmp dir,
trainer/checkpoint.py): torch DCP writes each rank's own shards, so no rank holds the full state, and a
load may use another world size (DCP reshards). Scheduler and RNG states are JSON.

Nothing loaded here unpickles code: DCP's `.metadata` pickle goes through `_SafeFileSystemReader`, whose
unpickler resolves only DCP's metadata dataclasses and torch's plain value types, and the non-tensor items
in its shards (param_groups) through torch's weights-only unpickler (`_SafeLoadPlanner`); anything else is
refused in one line naming the file and the item. The sharded state holds the fp32 masters and AdamW
states, so a resume continues from exactly the trained values.
Every file goes through logicrl/checksums.py as it is written (DCP through `_SummingWriter`), so the
manifest needs no second read of them.
"""

from __future__ import annotations

import enum
import io
import json
import pickle
import pickletools
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from logicrl.checkpoint_layout import start_over_hint, step_of
from logicrl.checksums import Checksums
from logicrl.errors import BadInput
from logicrl.rng import capture_rng_state, restore_rng_state

SCHEDULER_FILE = "lr_scheduler.json"
META_FILE = "meta.json"


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
            raise _NotPlainData(f"checkpoint metadata names {module}.{name}, which is not plain data")
        return obj


class _NotPlainData(pickle.UnpicklingError):
    """A refused global, as opposed to bytes that do not parse (a damaged file)."""


class UnsafeCheckpoint(BadInput):
    """A pickle in a checkpoint names a type logicrl never writes there: refused, nothing of it run.
    (One message argument, like BadInput: Ray re-creates it on the driver from its args.)"""


def unsafe(path: str | Path, item: str, err: Exception, data: bytes = b"") -> UnsafeCheckpoint:
    named = _globals_named(data)
    what = f"it names {', '.join(named)}" if named else " ".join(str(err).split()).split("WeightsUnpickler error: ")[-1]
    # The global_step_N directory the file is in: what the user moves aside.
    checkpoint = next((p for p in Path(path).parents if step_of(p) is not None), Path(path).parent)
    return UnsafeCheckpoint(f"checkpoint file {path}, item {item}: a pickle that is not plain data ({what[:160]}); a "
                            "logicrl checkpoint holds only tensors and plain values, so it was refused and nothing in "
                            f"it ran: resume from a checkpoint you wrote yourself (mv {checkpoint} "
                            f"{checkpoint}.refused, and the same command resumes the one before it); or, "
                            f"{start_over_hint(checkpoint.parent)}")


def _globals_named(data: bytes) -> list[str]:
    """The module.name globals a pickle refers to, read without running it (for the refusal's line)."""
    names, strings = [], []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "SHORT_BINSTRING", "BINSTRING"):
                strings.append(str(arg))
            elif op.name == "GLOBAL":
                names.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                names.append(f"{strings[-2]}.{strings[-1]}")
    except Exception:  # a damaged pickle: torch's own message says what is wrong
        pass
    return names


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's non-tensor items (the optimizer's param_groups: lr, betas, ...) are pickles inside the
    shard files, which DCP reads with `weights_only=False`: any code they name would run. Here they go
    through torch's weights-only unpickler (plain values, tensors, containers), then to DCP as usual."""

    def __init__(self, directory: Path):
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item, value) -> None:
        data = value.getvalue()
        try:
            obj = torch.load(io.BytesIO(data), weights_only=True)
        except pickle.UnpicklingError as err:
            info = self.metadata.storage_data.get(read_item.storage_index) if self.metadata else None
            path = self.directory / info.relative_path if info is not None else self.directory
            raise unsafe(path, read_item.dest_index.fqn, err, data) from None
        plain = io.BytesIO()
        torch.save(obj, plain)  # what DCP's own load_bytes reads: now a pickle of vetted values only
        plain.seek(0)
        super().load_bytes(read_item, plain)


def _dcp_load(state: dict, directory: Path) -> None:
    """dcp.load through the safe reader and planner; a refused pickle comes out as one line."""
    reader = _SafeFileSystemReader(directory)
    try:
        dcp.load(state, storage_reader=reader, planner=_SafeLoadPlanner(directory))
    except CheckpointException as err:
        if reader.refused is not None:  # DCP folds a failed index read into an AssertionError's text
            raise reader.refused from None
        for failure in err.failures.values():
            cause = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(cause, UnsafeCheckpoint):
                raise cause from None
        raise misfit(directory, err) or err from None


def misfit(directory: Path, err: CheckpointException) -> BadInput | None:
    """DCP's `CheckpointException ranks:dict_keys([0])` when the checkpoint's tensors do not fit the model (a
    missing key, another shape): one line naming the checkpoint and the first cause. None for a read error (a
    file gone or unreadable), which is the disk's story. The preflight compares a checkpoint's shape.json with
    the run first (preflight/checkpoints.py); one saved before that file existed gets here."""
    causes = [f[0] if isinstance(f, tuple) else f for f in err.failures.values()]
    if not causes or any(isinstance(c, OSError) for c in causes):
        return None
    first = next((line for line in str(causes[0]).splitlines() if line.strip()), type(causes[0]).__name__)
    step = directory.parent if directory.parent.name.startswith("global_step_") else directory
    old = "" if (step / "shape.json").is_file() else (" (it has no shape.json, the record of its model that lets the "
                                                      "preflight compare it with the run: an older logicrl saved it)")
    return BadInput(f"{directory} does not fit this run's model ({type(causes[0]).__name__}: {first[:200]}){old}: "
                    "resume it with the model (and LoRA settings) it was saved with, or start over with "
                    "trainer.resume_mode=disable")


class _SafeFileSystemReader(dcp.FileSystemReader):
    refused: UnsafeCheckpoint | None = None

    def read_metadata(self, *args, **kwargs):
        from torch.distributed.checkpoint.metadata import StorageMeta

        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            data = f.read()
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except pickle.UnpicklingError as err:
            self.refused = unsafe(path, "the DCP index", err, data)
            raise self.refused from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def index_damage(checkpoint: str | Path) -> str | None:
    """What is wrong with a checkpoint's sharded state without a manifest to compare it with, or None:
    each DCP index (actor/.metadata, critic/.metadata) must parse, and every item it names must lie
    inside its shard file (a file cut short or missing is found without reading the shards). The
    small JSON files beside them must parse. A pickle naming a foreign type is refused (UnsafeCheckpoint)."""
    checkpoint = Path(checkpoint)
    for index in sorted(checkpoint.glob("*/.metadata")):
        rel = index.relative_to(checkpoint)
        data = index.read_bytes()
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except _NotPlainData as err:
            raise unsafe(index, "the DCP index", err, data) from None
        except Exception as err:  # any byte can be wrong: whatever the unpickler trips on is damage
            return f"its DCP index {rel} does not parse ({type(err).__name__})"
        sizes: dict[str, int] = {}
        for info in getattr(metadata, "storage_data", {}).values():
            name = info.relative_path
            if name not in sizes:
                shard = index.parent / name
                sizes[name] = shard.stat().st_size if shard.is_file() else -1
            if sizes[name] < 0:
                return f"{rel.parent / name} is missing"
            if info.offset + info.length > sizes[name]:
                return f"{rel.parent / name} is {sizes[name]} bytes, its index needs {info.offset + info.length}"
    for small in [*checkpoint.glob("*.json"), *checkpoint.glob("*/*.json")]:
        try:
            json.loads(small.read_text())
        except (UnicodeDecodeError, ValueError):
            return f"{small.relative_to(checkpoint)} does not parse"
    return None


# ---------------------------------------------------------------- summing DCP's writes
class _SummingFileSystem(FileSystem):
    """DCP's local file system, with every file it writes going through a Checksums record."""

    def __init__(self, sums: Checksums):
        super().__init__()
        self.sums = sums

    @contextmanager
    def create_stream(self, path, mode: str):
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with self.sums.open(path) as stream:
            yield stream

    def rename(self, path, new_path) -> None:
        super().rename(path, new_path)
        self.sums.moved(path, new_path)  # .metadata is written as .metadata.tmp, then renamed


class _SummingWriter(dcp.FileSystemWriter):
    def __init__(self, directory: Path, sums: Checksums):
        super().__init__(directory)
        self.fs = _SummingFileSystem(sums)


def _disk_error(err: CheckpointException) -> OSError | None:
    """The first OSError behind DCP's CheckpointException ("ranks:dict_keys([0])", which names no
    cause): a full disk or a read-only directory must reach the user as itself."""
    for failure in err.failures.values():
        cause = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(cause, OSError):
            return cause
    return None


# ---------------------------------------------------------------- model + optimizer + scheduler
def save_sharded(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler, trainable_only: bool = False, fault: OSError | None = None) -> None:
    """Every rank: write its shards of `model` and `optimizer`, plus the scheduler (rank 0) and its RNG.

    `trainable_only` (for LoRA) skips frozen parameters: the base weights come back from
    actor_rollout_ref.model.path on load, so a checkpoint holds only the adapter and its optimizer.
    A file system error comes out as the OSError itself (every rank raises it: DCP gathers failures).
    `fault`: a test's injected disk error (logicrl/faults.py), raised by the first write.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    options = StateDictOptions(ignore_frozen_params=trainable_only)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    with Checksums(directory, f"rank{_rank()}", fault) as sums:
        try:
            dcp.save({"model": model_sd, "optim": optim_sd}, storage_writer=_SummingWriter(directory, sums))
        except CheckpointException as err:
            cause = _disk_error(err)
            if cause is None:
                raise
            raise cause from err
        sums.write_bytes(directory / f"rng_rank{_rank()}.json", json.dumps(capture_rng_state()).encode())
        if _rank() == 0:
            sched = scheduler.state_dict()
            # LambdaLR stores plain functions as None (they are rebuilt from config); a callable object
            # here would need pickle, so fail loudly at save time rather than at resume.
            sums.write_bytes(directory / SCHEDULER_FILE, json.dumps(sched).encode())
            world = dist.get_world_size() if dist.is_initialized() else 1
            meta = {"trainable_only": trainable_only, "world_size": world}
            sums.write_bytes(directory / META_FILE, json.dumps(meta).encode())
    _barrier()  # the controller commits after this returns on every rank: all files are written


def load_sharded(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                 scheduler=None, restore_rng: bool = True) -> None:
    """Every rank: load what `save_sharded` wrote into the already sharded `model`, `optimizer`, `scheduler`.

    The optimizer must be built over the same parameters (same config); the world size may differ.
    `optimizer=None` loads the model weights alone (a curriculum stage's start, the reference model);
    `scheduler=None` leaves the scheduler as built (a new stage restarts its schedule). With both, the
    moments and the schedule's position come from the checkpoint, the hyperparameters from this run's
    config (`keep_configured`).
    """
    directory = Path(directory)
    configured = configured_settings(optimizer, scheduler) if optimizer is not None and scheduler is not None else None
    meta = json.loads((directory / META_FILE).read_text())
    options = StateDictOptions(ignore_frozen_params=meta["trainable_only"])
    if optimizer is None:
        model_sd = get_model_state_dict(model, options=options)
        state = {"model": model_sd}
        _dcp_load(state, directory)  # reads only the keys asked for
        set_model_state_dict(model, state["model"], options=StateDictOptions(strict=not meta["trainable_only"]))
    else:
        # get_state_dict gives correctly sharded targets (and initialises empty optimizer state) to load into.
        model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
        state = {"model": model_sd, "optim": optim_sd}
        _dcp_load(state, directory)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=not meta["trainable_only"]))
    if scheduler is not None:
        scheduler.load_state_dict(json.loads((directory / SCHEDULER_FILE).read_text()))
    if configured is not None:
        keep_configured(optimizer, scheduler, configured)
    rng = directory / f"rng_rank{_rank()}.json"
    if restore_rng and rng.is_file():  # absent when resuming on more ranks than saved: keep the seeded state
        restore_rng_state(json.loads(rng.read_text()))


def load_stage_start(directory: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                     carry_optimizer: bool) -> None:
    """A curriculum stage's start: the previous stage's weights (and, if asked, its Adam moments).

    The lr and weight decay come from this stage's own config and schedule, not from the loaded param groups.
    """
    configured = configured_settings(optimizer, scheduler)
    load_sharded(directory, model, optimizer if carry_optimizer else None, restore_rng=False)
    keep_configured(optimizer, scheduler, configured)


def configured_settings(optimizer: torch.optim.Optimizer, scheduler) -> list[dict]:
    """Per param group, what this run's config built (workers/fsdp.py build_optimizer): the peak lr and the
    weight decay. Taken before a load overwrites them with the checkpoint's."""
    return [{"lr": base, "weight_decay": group["weight_decay"]}
            for group, base in zip(optimizer.param_groups, scheduler.base_lrs)]


def keep_configured(optimizer: torch.optim.Optimizer, scheduler, configured: list[dict]) -> None:
    """After a load: this run's peak lr and weight decay replace the checkpoint's, at the schedule's
    loaded position. DCP restores the param groups as saved (lr, initial_lr, weight_decay) and the
    scheduler its base_lrs, so without this a resumed run would keep training at the checkpoint's lr
    whatever the command line says (and a diverged run's lower lr would never take). The schedule's
    shape (warm-up, decay, total steps) is this run's already: LambdaLR saves no function, it keeps
    the one built from the config."""
    scheduler.base_lrs = [c["lr"] for c in configured]
    for group, want, factor in zip(optimizer.param_groups, configured, scheduler.lr_lambdas):
        group["initial_lr"] = want["lr"]
        group["weight_decay"] = want["weight_decay"]
        group["lr"] = want["lr"] * factor(scheduler.last_epoch)
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


# ---------------------------------------------------------------- HF export
