"""How the trainer's weights reach a rollout engine: one interface, whatever lies between them.

A sync is a `Payload`: what it carries (the merged weights, the base once, or the LoRA adapters), the
version of the weights (the step whose update made them) and the named tensors, gathered bucket by bucket
(workers/weight_sync.py). The sender calls `send`; the rollout side's `receive` loads what arrived into its
engine. `describe` takes the tensors' names, shapes and dtypes once, before the first sync, so a transport
between processes can allocate its receive buckets from them instead of sending them with every bucket.
Every transport counts what it moved and can fold each tensor into a checksum on the way (`checksum=True`),
the check that an engine holds exactly what the trainer sent.

`InProcess` is the colocated worker's: the engine lives in the sender's process and takes the tensors by
reference as they are gathered, so `send` also loads them and `receive` has nothing left to wait for.
A collective broadcast between device groups implements the same four calls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

KINDS = ("weights", "base", "adapters")  # merged weights; the base alone (adapters not folded in); adapters


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass
class Payload:
    kind: str  # one of KINDS: which engine call loads it
    version: int  # the weights' version: the step whose update produced them (0: as loaded)
    tensors: Iterable[tuple[str, torch.Tensor]]  # (engine name, full tensor), a bucket at a time

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"no payload kind {self.kind!r}; they are {', '.join(KINDS)}")


@dataclass
class Receipt:
    """What one sync moved: its kind and version, the tensors and bytes, and their checksum (None: not asked)."""

    kind: str
    version: int
    tensors: int = 0
    bytes: int = 0
    checksum: str | None = None


class Checksum:
    """An order-sensitive digest of named tensors: the names, dtypes, shapes and raw bytes."""

    def __init__(self):
        self._hash = hashlib.blake2b(digest_size=16)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        t = tensor.detach().contiguous().cpu()
        self._hash.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        self._hash.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def checksum_of(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    digest = Checksum()
    for name, tensor in tensors:
        digest.add(name, tensor)
    return digest.hexdigest()


@dataclass
class _Counted:
    """Passes named tensors through, counting them (and hashing them when asked) as the consumer pulls."""

    tensors: Iterable[tuple[str, torch.Tensor]]
    receipt: Receipt
    digest: Checksum | None = field(default=None)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self.tensors:
            self.receipt.tensors += 1
            self.receipt.bytes += tensor.numel() * tensor.element_size()
            if self.digest is not None:
                self.digest.add(name, tensor)
            yield name, tensor
        if self.digest is not None:
            self.receipt.checksum = self.digest.hexdigest()


class Transport(Protocol):
    def describe(self, kind: str, meta: list[TensorMeta]) -> None:
        """The names, shapes and dtypes a payload of `kind` carries, once, before its first send."""

    def send(self, payload: Payload) -> Receipt:
        """The trainer's side: move the payload's tensors, bucket by bucket."""

    def receive(self, engine) -> Receipt:
        """The rollout side: load the next sync into `engine`; its receipt."""


def load_into(engine, kind: str, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """The engine call that takes a payload of `kind` (workers/rollout/base.py's sync methods)."""
    if kind == "adapters":
        engine.sync_adapters(tensors)
    else:
        engine.sync_weights(tensors)


class InProcess:
    """The colocated worker's transport: the engine is in this process and takes the tensors as they
    are gathered (by reference: the bucket caps the memory, nothing is copied)."""

    def __init__(self, engine, checksum: bool = False):
        self.engine, self.checksum = engine, checksum
        self.meta: dict[str, list[TensorMeta]] = {}
        self.version: int = 0  # the version the engine holds
        self.last: Receipt | None = None

    def describe(self, kind: str, meta: list[TensorMeta]) -> None:
        self.meta[kind] = list(meta)

    def send(self, payload: Payload) -> Receipt:
        receipt = Receipt(payload.kind, payload.version)
        load_into(self.engine, payload.kind, _Counted(payload.tensors, receipt,
                                                      Checksum() if self.checksum else None))
        self.version, self.last = payload.version, receipt
        return receipt

    def receive(self, engine) -> Receipt:
        """Nothing to wait for: `send` loaded the engine in this process. The last sync's receipt."""
        if engine is not self.engine:
            raise ValueError("an in-process transport delivers to the engine it was built with")
        if self.last is None:
            raise RuntimeError("nothing was sent through this transport yet")
        return self.last
