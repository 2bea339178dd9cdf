"""Is a weight file whole? Read from its header and directory alone, never its data, and without torch.

    read_header(path)          # a safetensors file's {tensor name: entry}; WeightFileError if unreadable
    safetensors_problem(path)  # why its tensors do not fit the file (cut short, a range off the end), or None
    torch_bin_problem(path)    # why a pytorch_model*.bin zip archive is cut short, or None

A safetensors file is an 8-byte little-endian header length, a JSON header giving each tensor's dtype,
shape and data_offsets (relative to the end of the header), then the data. safetensors refuses a file
whose ranges do not tile its data exactly; found at load time that is a SafetensorError inside a Ray
actor after minutes of start-up, found here a one-line error. A torch .bin written by torch.save is a
zip archive whose directory sits at the end of the file, so a cut-short one has lost it; the legacy
(pre-1.6, non-zip) pickle format has no such cheap check and is left to torch.
"""

from __future__ import annotations

import json
import math
import struct
import zipfile
from pathlib import Path

from logicrl.models.spec import ModelSpecError

# Bits per element of each safetensors dtype (sub-byte floats are packed). A dtype not listed (a newer
# safetensors) has its range checked against the file, not against its shape.
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
              "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "I64": 64, "U64": 64, "F64": 64, "F4": 4,
              "F6_E2M3": 6, "F6_E3M2": 6}
# safetensors' own limit: a longer "header" is a damaged length field, not a header.
MAX_HEADER_BYTES = 100_000_000
RECOPY = "copy it again from the source checkpoint (or re-save the model)"


class WeightFileError(ModelSpecError):
    """A weight file that cannot be read as what its name says; one line naming the file and the fix."""


def read_header(path: Path) -> dict:
    """{tensor name: {dtype, shape, data_offsets}} of a safetensors file (its __metadata__ left out)."""
    return _read(path)[0]


def _read(path: Path) -> tuple[dict, int]:
    """The header and the byte where the data starts."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightFileError(f"{path} is {size} bytes, too short for a safetensors header: {RECOPY}")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES:
            raise WeightFileError(f"{path} does not start with a safetensors header (its length field reads "
                                  f"{length} bytes): {RECOPY}")
        if 8 + length > size:
            raise WeightFileError(f"{path} is cut short inside its header ({size} bytes, the header alone needs "
                                  f"{8 + length}): {RECOPY}")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WeightFileError(f"{path} has a damaged safetensors header ({type(err).__name__}): {RECOPY}") from None
    if not isinstance(header, dict):
        raise WeightFileError(f"{path} has a damaged safetensors header (not a JSON object): {RECOPY}")
    header.pop("__metadata__", None)
    return header, 8 + length


def safetensors_problem(path: Path) -> str | None:
    """Why `path`'s tensors do not lie exactly in its data (each range inside the file, of its dtype x
    shape bytes, the ranges tiling the data as safetensors requires), or None. Reads the header only."""
    try:
        header, data_start = _read(path)
    except WeightFileError as err:
        return str(err)
    data_bytes = path.stat().st_size - data_start
    spans = []
    for name, entry in header.items():
        try:
            begin, end = (int(v) for v in entry["data_offsets"])
            shape, dtype = [int(d) for d in entry["shape"]], entry["dtype"]
        except (TypeError, KeyError, ValueError):
            return f"{path}: tensor {name!r} has a damaged header entry {str(entry)[:80]}: {RECOPY}"
        bits = DTYPE_BITS.get(dtype)
        if bits is not None and (end - begin) * 8 != math.prod(shape) * bits:
            return (f"{path}: tensor {name!r} is {dtype} {shape} ({math.prod(shape) * bits // 8} bytes) but its "
                    f"data_offsets span {end - begin} bytes: the header is damaged; {RECOPY}")
        spans.append((begin, end, name))
    spans.sort()
    last = max((end for _, end, _ in spans), default=0)
    if last > data_bytes:
        name = next(n for _, end, n in spans if end == last)
        return (f"{path} is cut short: tensor {name!r} ends at byte {data_start + last} but the file has "
                f"{data_start + data_bytes} bytes ({last - data_bytes} missing): {RECOPY}")
    position = 0
    for begin, end, name in spans:
        if begin != position:
            what = "overlaps the one before it" if begin < position else f"leaves a gap of {begin - position} bytes"
            return f"{path}: tensor {name!r} {what} in the data section: the header is damaged; {RECOPY}"
        position = end
    if position != data_bytes:
        return (f"{path} has {data_bytes - position} bytes after its last tensor, which safetensors refuses to "
                f"load: {RECOPY}")
    return None


def torch_bin_problem(path: Path) -> str | None:
    """Why a torch.save zip archive at `path` is cut short or damaged, or None (also for the legacy
    non-zip format, which this does not check). Reads the zip's directory at the end of the file only."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        return None if path.stat().st_size else f"{path} is empty: {RECOPY}"
    try:
        with zipfile.ZipFile(path) as archive:
            size = path.stat().st_size
            for info in archive.infolist():
                # The local header (30 bytes + name) then the stored data must lie in the file.
                if info.header_offset + 30 + len(info.filename) + info.compress_size > size:
                    return f"{path} is cut short: {info.filename} ends past its {size} bytes: {RECOPY}"
        with zipfile.ZipFile(path) as archive:
            pickled = [n for n in archive.namelist() if n.endswith("data.pkl")]
            code = foreign_global(archive.read(pickled[0])) if pickled else None
    except zipfile.BadZipFile as err:
        return f"{path} is a damaged or cut-short torch zip archive ({err}): {RECOPY}"
    if code is not None:
        return (f"{path} names {code} in its pickle, which is code, not tensors: torch loads weights with "
                "weights_only and refuses it (and it could run code); convert the weights to safetensors from a "
                "source you trust, or use another checkpoint")
    return None


# What a torch.save of tensors pickles: torch's rebuild functions, storages and dtypes, an OrderedDict, plain
# containers. torch's own weights_only unpickler is the guard; this only names the file before anything starts.
PLAIN_GLOBALS = {("collections", "OrderedDict"), ("_codecs", "encode")} | {
    ("builtins", name) for name in ("set", "frozenset", "slice", "complex", "bytearray", "int", "float", "bool",
                                    "str", "tuple", "list", "dict")}


def foreign_global(data: bytes) -> str | None:
    """The first `module.name` a pickle would import that is neither torch's nor plain data, or None."""
    import pickletools

    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings = [*strings[-1:], arg]
            elif op.name in ("GLOBAL", "STACK_GLOBAL", "INST"):
                module, name = arg.split(" ", 1) if op.name != "STACK_GLOBAL" else (strings + ["", ""])[:2]
                if not (module == "torch" or module.startswith("torch.")) and (module, name) not in PLAIN_GLOBALS:
                    return f"{module}.{name}"
    except (ValueError, EOFError):  # not a pickle torch could read either: torch says so as it loads
        return None
    return None


def tensor_names(directory: Path) -> list[str] | None:
    """Every tensor name in `directory`'s safetensors weights (one file, or the shards an index lists),
    or None where there are none or a header cannot be read (the weight check says why)."""
    index = directory / "model.safetensors.index.json"
    try:
        if index.is_file():
            return sorted(json.loads(index.read_text())["weight_map"])
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            return None
        return sorted(name for path in files for name in read_header(path))
    except (OSError, ValueError, KeyError, TypeError):  # WeightFileError and JSONDecodeError are ValueErrors
        return None
