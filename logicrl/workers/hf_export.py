"""The HF export of a rank's model: `export_hf` gathers one parameter at a time (weight_sync, LoRA merged)
into safetensors on rank 0, written through its own streaming writer (logicrl/checksums.py sums each file
as it is written); with LoRA also the adapter alone, in peft's format. The export is in the compute dtype
(what the engine serves, at half the size of the fp32 masters in the sharded checkpoint); nothing resumes
from it."""


from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import torch

from logicrl.checksums import Checksums
from logicrl.models.loading import checkpoint_dir
from logicrl.workers.checkpoint import _barrier, _rank
from logicrl.workers.fsdp import full_tensor
from logicrl.workers.weight_sync import iter_engine_weights

LORA_ADAPTER_DIR = "lora_adapter"  # verl's name for the adapter beside the merged export
SHARD_BYTES = 2 * 1024**3  # per safetensors file; HF's own default is 5 GB, smaller uploads and copies more easily
# Files of the source checkpoint that an export must not copy: we write our own weights and index.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".index.json")


def _is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def _copy_source_files(source: Path, out_dir: Path, sums: Checksums) -> None:
    """config.json, tokenizer and generation config from the source checkpoint; never its weights."""
    for entry in source.iterdir():
        if entry.is_file() and not entry.name.endswith(_WEIGHT_SUFFIXES) and not entry.name.startswith("."):
            with open(entry, "rb") as src, sums.open(out_dir / entry.name) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)


# safetensors' dtype names (its format spec); the export holds floating weights, the rest for completeness.
_SAFETENSORS_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                       torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
                       torch.uint8: "U8", torch.bool: "BOOL"}


def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], sums: Checksums,
                      metadata: dict[str, str] | None = None) -> None:
    """`tensors` as one safetensors file, streamed tensor by tensor through `sums`.

    The format (an 8-byte little-endian header length, a JSON header padded with spaces to 8 bytes,
    then each tensor's bytes back to back, little-endian) written here rather than by safetensors'
    save_file, which writes from Rust where no checksum can see the bytes; its `save` would hold the
    whole file in memory a second time. safetensors' own loaders read what this writes (tested).
    """
    header: dict = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with sums.open(path) as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for tensor in tensors.values():
            if tensor.numel():
                # x86 and ARM are little-endian, as the format is: the bytes go as they are in memory.
                f.write(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


class _ShardWriter:
    """Buffers tensors up to `limit` bytes, then writes one safetensors file; names fixed at close."""

    def __init__(self, out_dir: Path, limit: int, sums: Checksums):
        self.out_dir, self.limit, self.sums = out_dir, limit, sums
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
        path = self.out_dir / f".shard-{len(self.files):05d}.partial"
        write_safetensors(path, self.buffer, self.sums, metadata={"format": "pt"})
        self.files.append((path, list(self.buffer)))
        self.buffer, self.size = {}, 0

    def _rename(self, path: Path, final: str) -> None:
        os.replace(path, self.out_dir / final)
        self.sums.moved(path, self.out_dir / final)

    def close(self) -> None:
        if self.buffer or not self.files:
            self._flush()
        if len(self.files) == 1:
            self._rename(self.files[0][0], "model.safetensors")
            return
        weight_map = {}
        n = len(self.files)
        for i, (path, names) in enumerate(self.files):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            self._rename(path, final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {"total_size": self.total}, "weight_map": weight_map}
        self.sums.write_bytes(self.out_dir / "model.safetensors.index.json", json.dumps(index, indent=2).encode())


def export_hf(model: torch.nn.Module, out_dir: str | Path, source_path: str, merge_lora: bool = False,
              shard_bytes: int = SHARD_BYTES, dtype: torch.dtype | None = None, fault: OSError | None = None) -> None:
    """Every rank: write `model` as a HF directory in `out_dir` (rank 0 writes; the others help gather).

    `source_path` is actor_rollout_ref.model.path: config.json and the tokenizer are copied from it.
    Without LoRA `out_dir` holds the full model. With LoRA the adapter goes to `out_dir/lora_adapter`
    (peft's save format, loadable with PeftModel.from_pretrained over the source model), and the
    merged full model goes to `out_dir` only when `merge_lora` (it is the size of the base model).
    Peak extra memory on rank 0 is one shard plus one gathered parameter. `dtype`: the weights' dtype
    in the export (None: as the model stores them); the adapter stays in its own (fp32). `fault` as
    for save_sharded.
    """
    out_dir = Path(out_dir)
    rank0 = _rank() == 0
    lora = _is_lora(model)
    if rank0:
        out_dir.mkdir(parents=True, exist_ok=True)
    # Only rank 0 writes here; the others' record stays empty and is not written.
    sums = Checksums(out_dir, "rank0", fault)
    if lora:
        _export_lora_adapter(model, out_dir / LORA_ADAPTER_DIR, source_path, rank0, sums)
    if not lora or merge_lora:
        writer = _ShardWriter(out_dir, shard_bytes, sums) if rank0 else None
        # Every rank iterates: each full_tensor() is a collective all-gather.
        for name, tensor in iter_engine_weights(model, dtype=dtype):
            if writer is not None:
                writer.add(name, tensor)
        if rank0:
            writer.close()
            _copy_source_files(checkpoint_dir(source_path), out_dir, sums)
    if rank0:
        sums.write_record()
    _barrier()


def _export_lora_adapter(model: torch.nn.Module, out_dir: Path, source_path: str, rank0: bool,
                         sums: Checksums) -> None:
    from peft import get_peft_model_state_dict

    # Gather only the adapter parameters (small); peft then maps names to its save format
    # (drops the adapter name, keeps the `base_model.model.` prefix it expects on load).
    gathered = {name: full_tensor(p).detach().cpu().contiguous()
                for name, p in model.named_parameters() if ".lora_" in name}
    if not rank0:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    adapter = get_peft_model_state_dict(model, state_dict=gathered)
    write_safetensors(out_dir / "adapter_model.safetensors", {k: v.contiguous() for k, v in adapter.items()}, sums,
                      metadata={"format": "pt"})
    config = model.peft_config["default"]
    previous = config.base_model_name_or_path
    # Point the adapter at the real directory (the embedded tiny model's cache, or the user's path).
    # peft writes adapter_config.json itself (a few hundred bytes): the manifest sums it by reading.
    config.base_model_name_or_path = str(checkpoint_dir(source_path).resolve())
    try:
        config.save_pretrained(str(out_dir))
    finally:
        config.base_model_name_or_path = previous
