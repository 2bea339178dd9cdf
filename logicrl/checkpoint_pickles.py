"""The driver's check that a checkpoint runs no code, before any rank loads it.

    refuse_code(path)   # path: global_step_N; UnsafeCheckpoint: one line naming the file, item, global

The only pickles a logicrl checkpoint holds are DCP's: each `.metadata` (the index) and the non-tensor
items in the `.distcp` shards (the optimizer's param_groups), which DCP itself reads with
`weights_only=False`. Each is read here by an unpickler whose find_class hands back inert stand-ins for
the few globals logicrl writes there and refuses every other one, so reading runs nothing whatever the
bytes say; the index's stand-ins then say where each non-tensor item lies. A pickle that does not read
to its end is damage, left to the trainer's manifest check, once its opcodes name no other global.
Torch-free (stdlib only): milliseconds, in the preflight. The ranks' loaders keep their own restricted
unpicklers (workers/checkpoint.py): this is the first of two checks, the one that answers in one line
before Ray or a rank starts.
"""

from __future__ import annotations

import io
import pickle
import pickletools
import re
import zipfile
from collections import OrderedDict
from pathlib import Path

from logicrl.errors import BadInput

INDEX = ".metadata"
# Plain-value globals of torch that both pickles may name: dtypes by name, sizes, devices, layouts.
_TORCH_DTYPE = re.compile(r"(b?float\d*|half|double|u?int\d*|long|short|bool|complex\d*|c(float|double|half)|"
                          r"q?u?int\d+x?\d*|float8_\w+|bits\w+)")
_TORCH_VALUES = {"Size", "device", "dtype", "layout", "memory_format"}
# Containers are themselves (building one runs nothing of the pickle's choosing); the rest become stubs.
_CONTAINERS = {("collections", "OrderedDict"): OrderedDict, ("builtins", "set"): set,
               ("builtins", "frozenset"): frozenset, ("builtins", "slice"): slice, ("builtins", "tuple"): tuple,
               ("builtins", "list"): list, ("builtins", "dict"): dict}
# The index: DCP's metadata dataclasses and enums (the ranks' unpickler checks they are no more), the
# layout helper and StorageMeta's path.
_INDEX_ONLY = {("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath")}
# A shard item: a torch.save of plain values, or of a tensor (a tensor-valued lr) rebuilt from its storage.
_ITEM_ONLY = {("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor"),
              ("torch.storage", "UntypedStorage"), ("torch.storage", "TypedStorage")}


class UnsafeCheckpoint(BadInput):
    """A pickle in a checkpoint names something logicrl never writes there: refused, nothing of it run."""


def refusal(path: str | Path, item: str, what: str) -> UnsafeCheckpoint:
    return UnsafeCheckpoint(f"checkpoint file {path}, item {item}: a pickle that is not plain data ({what[:160]}); a "
                            "logicrl checkpoint holds only tensors and plain values, so it was refused and nothing in "
                            "it ran: resume from a checkpoint you wrote yourself, or start over with "
                            "trainer.resume_mode=disable")


class _Stub:
    """What an allowed global becomes: it takes any arguments and state, and does nothing with them."""

    def __init__(self, *args, **kwargs):
        self.args = args

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict state, slots state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if isinstance(state, dict):
            self.__dict__.update(state)


class _Refused(Exception):
    pass


class _InertUnpickler(pickle.Unpickler):
    def __init__(self, stream, allowed):
        super().__init__(stream)
        self.allowed = allowed
        self.stubs: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str):
        if not self.allowed(module, name):
            raise _Refused(f"it names {module}.{name}")
        if (module, name) in _CONTAINERS:
            return _CONTAINERS[module, name]
        return self.stubs.setdefault((module, name), type(name, (_Stub,), {}))

    def persistent_load(self, pid):  # a tensor's storage in a torch.save: its bytes are not read here
        return None


def _torch_value(module: str, name: str) -> bool:
    return module == "torch" and (name in _TORCH_VALUES or name.endswith("Storage")
                                  or bool(_TORCH_DTYPE.fullmatch(name)))


def _index_allowed(module: str, name: str) -> bool:
    return (module.startswith("torch.distributed.checkpoint.") or _torch_value(module, name)
            or (module, name) in _CONTAINERS or (module, name) in _INDEX_ONLY)


def _item_allowed(module: str, name: str) -> bool:
    return _torch_value(module, name) or (module, name) in _CONTAINERS or (module, name) in _ITEM_ONLY


class _Unreadable(Exception):
    """Damage, not a refused global: the trainer's manifest check names it (and sets the checkpoint aside)."""


def _load(stream, allowed) -> object:
    """The next pickle in `stream` read inertly: _Refused for a global not allowed, _Unreadable otherwise."""
    start = stream.tell()
    try:
        return _InertUnpickler(stream, allowed).load()
    except _Refused:
        raise
    except Exception:
        stream.seek(start)
        _scan_opcodes(stream.read(), allowed)
        raise _Unreadable() from None


def _scan_opcodes(data: bytes, allowed) -> None:
    """For a pickle the inert reading could not finish: the globals it names, read off its opcodes
    (STACK_GLOBAL's from the strings pushed before it), as far as it parses."""
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING",
                           "STRING"):
                strings.append(str(arg))
            named = (str(arg).split(" ", 1) if op.name in ("GLOBAL", "INST") else
                     strings[-2:] if op.name == "STACK_GLOBAL" and len(strings) >= 2 else None)
            if op.name in ("EXT1", "EXT2", "EXT4"):  # copyreg's registry: a global by number
                raise _Refused(f"it names copyreg extension {arg}")
            if named is not None and not allowed(*named):
                raise _Refused(f"it names {'.'.join(named)}")
            if op.name == "STOP":
                return
    except _Refused:
        raise
    except Exception:  # parsed as far as it goes: the rest is damage
        pass


def _check_item(data: bytes) -> None:
    """A shard item as torch.save writes it (a zip with the pickle in */data.pkl), or the older format
    (pickles back to back, then raw storage bytes): every pickle in it read inertly."""
    if zipfile.is_zipfile(io.BytesIO(data)):
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for name in archive.namelist():
                if name.endswith(".pkl"):
                    _load(io.BytesIO(archive.read(name)), _item_allowed)
        return
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        _load(stream, _item_allowed)


def _check_dcp(directory: Path) -> int:
    """The non-tensor items read; 0 where the index is damaged (the items cannot be found then)."""
    index_path = directory / INDEX
    try:
        index = _load(io.BytesIO(index_path.read_bytes()), _index_allowed)
    except _Refused as err:
        raise refusal(index_path, "the DCP index", str(err)) from None
    except (_Unreadable, OSError):
        return 0
    kinds = getattr(index, "state_dict_metadata", None)
    places = getattr(index, "storage_data", None)
    if not isinstance(kinds, dict) or not isinstance(places, dict):
        return 0  # not DCP's Metadata: the ranks' reader refuses it by its own checks
    items = 0
    for key, info in places.items():
        fqn = getattr(key, "fqn", None)
        if type(kinds.get(fqn)).__name__ != "BytesStorageMetadata":
            continue  # a tensor's bytes: DCP reads them as raw storage, never unpickled
        rel, offset, length = (getattr(info, k, None) for k in ("relative_path", "offset", "length"))
        shard = directory / str(rel)
        if getattr(info, "transform_descriptors", None):
            raise refusal(shard, fqn, "it is stored through transforms, which logicrl never writes")
        try:
            with open(shard, "rb") as f:
                f.seek(int(offset))
                _check_item(f.read(int(length)))
            items += 1
        except _Refused as err:
            raise refusal(shard, fqn, str(err)) from None
        except (_Unreadable, OSError, TypeError, ValueError):
            pass  # damage: the trainer's manifest check names it
    return items


def refuse_code(checkpoint: str | Path) -> int:
    """Every DCP index and non-tensor shard item under `checkpoint` read inertly; UnsafeCheckpoint
    for the first one that names anything logicrl does not write there. Returns the items read."""
    return sum(_check_dcp(index_path.parent) for index_path in sorted(Path(checkpoint).rglob(INDEX)))
