"""The weight transport between device groups: the trainer's rank 0 broadcasts each sync to the rollout ranks.

The weight group is trainer rank 0 (its root) and every rollout rank, a process group of its own built on its
own TCP store: each side's default group is already its FSDP world or its engine's, and torch allows one
default group per process (vLLM and OpenRLHF build theirs the same way). gloo between CPU ranks, NCCL
between CUDA ones. A sync is the bucketed stream of workers/weight_sync.py repacked into flat byte buffers of
at most `rollout.update_weights_bucket_mb`: per payload a header (kind, version), per bucket its tensor count,
then the bytes; the names, shapes and dtypes were described once at set-up, so a bucket carries none. The
root ends each payload with the digest of what it sent; each receiver compares it with its digest of what it
unpacked and handed to its engine, and a mismatch is an error. Every collective waits at most `timeout_s`;
a miss raises `WeightSyncFailed`, one line naming the group, the phase and what it was waiting for.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from logicrl.workers.fsdp import loopback_store
from logicrl.workers.transport import KINDS, Checksum, Payload, Receipt, TensorMeta, load_into

GROUP = "trainer->rollout weight group"
MB = 2**20
POLL_S = 0.0005  # how often a wait looks at its collective (NCCL's wait does not block the host)


class WeightSyncFailed(RuntimeError):
    """A broadcast of the weight group missed its timeout or failed, or a sync arrived corrupted."""


class WeightGroup:
    """Rank 0 (the trainer's rank 0) and the rollout ranks 1..size-1, over one process group of their own."""

    def __init__(self, pg, rank: int, size: int, device: torch.device, timeout_s: float):
        self.pg, self.rank, self.size, self.device, self.timeout_s = pg, rank, size, device, timeout_s

    @classmethod
    def join(cls, addr: str, port: int, rank: int, size: int, device: torch.device, timeout_s: float) -> WeightGroup:
        """Every member calls this at the same time (the rendezvous waits for all `size`); rank 0 hosts the store."""
        timeout = timedelta(seconds=timeout_s)
        try:
            store = loopback_store(rank, size, addr, port, timeout) or dist.TCPStore(addr, port, size, rank == 0,
                                                                                      timeout)
            store = dist.PrefixStore("weights/", store)
            if device.type == "cuda":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                pg = dist.ProcessGroupNCCL(store, rank, size, options)
            else:
                pg = dist.ProcessGroupGloo(store, rank, size, timeout)
        except (RuntimeError, dist.DistStoreError) as err:
            raise WeightSyncFailed(f"{GROUP} ({size} ranks at {addr}:{port}) did not form within {timeout_s:g} s "
                                   f"(async_training.sync_timeout_s) in set-up: {first_line(err)}") from None
        return cls(pg, rank, size, device, timeout_s)

    def broadcast(self, tensor: torch.Tensor, phase: str, what: str) -> torch.Tensor:
        """Rank 0's `tensor` into every member's (same shape and dtype), waiting at most timeout_s."""
        start = time.monotonic()
        try:
            work = self.pg.broadcast(tensor, 0, timedelta(seconds=self.timeout_s))
            while not work.is_completed():
                if time.monotonic() - start > self.timeout_s:
                    raise TimeoutError(f"no answer after {self.timeout_s:g} s")
                time.sleep(POLL_S)
            work.wait()
        except (RuntimeError, TimeoutError) as err:
            raise WeightSyncFailed(f"{GROUP} ({self.size} ranks) failed in {phase} on its rank {self.rank} after "
                                   f"{time.monotonic() - start:.1f} s, {what}: {first_line(err)}; a rollout or "
                                   "trainer rank stalled or died (async_training.sync_timeout_s bounds the wait)"
                                   ) from None
        return tensor


def first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def nbytes(meta: TensorMeta) -> int:
    return int(torch.Size(meta.shape).numel()) * meta.dtype.itemsize


class BroadcastSender:
    """The trainer's side. Every trainer rank calls `send` (each takes part in the stream's FSDP all-gathers);
    only the group's root (`group` not None) broadcasts, the others drain the stream."""

    def __init__(self, bucket_mb: float, checksum: bool = True):
        self.group: WeightGroup | None = None
        self.limit, self.checksum = bucket_mb * MB, checksum
        self.meta: dict[str, list[TensorMeta]] = {}
        self.version: int = 0  # the version last sent
        self.last: Receipt | None = None

    def describe(self, kind: str, meta: list[TensorMeta]) -> None:
        self.meta[kind] = list(meta)

    def send(self, payload: Payload) -> Receipt:
        receipt = Receipt(payload.kind, payload.version)
        if self.group is None:  # not the root: gather with the others, send nothing
            for _, tensor in payload.tensors:
                receipt.tensors += 1
                receipt.bytes += tensor.numel() * tensor.element_size()
        else:
            self._broadcast(payload, receipt)
        self.version, self.last = payload.version, receipt
        return receipt

    def _broadcast(self, payload: Payload, receipt: Receipt) -> None:
        group, meta, digest = self.group, self.meta[payload.kind], Checksum() if self.checksum else None
        phase = f"sending {payload.kind} version {payload.version}"
        group.broadcast(torch.tensor([KINDS.index(payload.kind), payload.version], device=group.device), phase,
                        "the payload's header")
        bucket: list[torch.Tensor] = []
        held, buckets = 0, 0

        def flush():
            nonlocal held, buckets
            buckets += 1
            group.broadcast(torch.tensor([len(bucket)], device=group.device), phase, f"bucket {buckets}'s count")
            flat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8).to(group.device) for t in bucket])
            group.broadcast(flat, phase, f"bucket {buckets} ({len(flat)} bytes)")
            bucket.clear()
            held = 0

        for name, tensor in payload.tensors:
            expected = meta[receipt.tensors] if receipt.tensors < len(meta) else None
            if expected is None or (name, tuple(tensor.shape), tensor.dtype) != (expected.name, expected.shape,
                                                                                  expected.dtype):
                raise ValueError(f"the {payload.kind} stream's tensor {receipt.tensors} is {name} "
                                 f"{tuple(tensor.shape)} {tensor.dtype}, not what was described: {expected}")
            size = tensor.numel() * tensor.element_size()
            if bucket and held + size > self.limit:
                flush()
            bucket.append(tensor)
            held += size
            receipt.tensors += 1
            receipt.bytes += size
            if digest is not None:
                digest.add(name, tensor)
        if bucket:
            flush()
        if receipt.tensors != len(meta):
            raise ValueError(f"the {payload.kind} stream sent {receipt.tensors} tensors of the {len(meta)} described")
        group.broadcast(torch.tensor([0], device=group.device), phase, "the end marker")
        receipt.checksum = digest.hexdigest() if digest is not None else None
        group.broadcast(_digest_tensor(receipt.checksum, group.device), phase, "the checksum")


class BroadcastReceiver:
    """A rollout rank's side: `receive` loads the next sync into its engine as the buckets arrive."""

    def __init__(self, checksum: bool = True):
        self.group: WeightGroup | None = None
        self.checksum = checksum
        self.meta: dict[str, list[TensorMeta]] = {}
        self.version: int = 0  # the version the engine holds
        self.last: Receipt | None = None

    def describe(self, kind: str, meta: list[TensorMeta]) -> None:
        self.meta[kind] = list(meta)

    def send(self, payload: Payload) -> Receipt:
        raise RuntimeError("a rollout rank receives weights; the trainer's rank 0 sends them")

    def receive(self, engine) -> Receipt:
        group = self.group
        header = group.broadcast(torch.zeros(2, dtype=torch.long, device=group.device), "receiving weights",
                                 "a payload's header")
        kind, version = KINDS[int(header[0])], int(header[1])
        receipt, digest = Receipt(kind, version), Checksum() if self.checksum else None
        load_into(engine, kind, self._incoming(kind, version, receipt, digest))
        sent = group.broadcast(_digest_tensor(None, group.device), f"receiving {kind} version {version}",
                               "the checksum")
        if digest is not None:
            receipt.checksum = digest.hexdigest()
            if bytes(sent.cpu().tolist()).hex() != receipt.checksum:
                raise WeightSyncFailed(f"{GROUP}: the {kind} of version {version} that rollout rank {group.rank - 1} "
                                       f"received differ from what the trainer sent (checksum "
                                       f"{receipt.checksum} != {bytes(sent.cpu().tolist()).hex()})")
        self.version, self.last = version, receipt
        return receipt

    def _incoming(self, kind: str, version: int, receipt: Receipt, digest: Checksum | None
                  ) -> Iterator[tuple[str, torch.Tensor]]:
        group, meta = self.group, self.meta[kind]
        phase = f"receiving {kind} version {version}"
        while True:
            count = int(group.broadcast(torch.zeros(1, dtype=torch.long, device=group.device), phase,
                                        f"bucket {receipt.tensors}'s count")[0])
            if count == 0:
                break
            parts = meta[receipt.tensors:receipt.tensors + count]
            if len(parts) != count:
                raise WeightSyncFailed(f"{GROUP}: a {kind} bucket of {count} tensors passes the {len(meta)} described")
            flat = group.broadcast(torch.empty(sum(map(nbytes, parts)), dtype=torch.uint8, device=group.device),
                                   phase, f"a bucket of {count} tensors")
            offset = 0
            for m in parts:
                size = nbytes(m)
                tensor = flat[offset:offset + size].view(m.dtype).view(m.shape)
                offset += size
                receipt.tensors += 1
                receipt.bytes += size
                if digest is not None:
                    digest.add(m.name, tensor)
                yield m.name, tensor
        if receipt.tensors != len(meta):
            raise WeightSyncFailed(f"{GROUP}: {receipt.tensors} {kind} tensors arrived of the {len(meta)} described")


def _digest_tensor(hexdigest: str | None, device: torch.device) -> torch.Tensor:
    """A 16-byte digest as a uint8 tensor (zeros: none, or a receive buffer)."""
    raw = bytes.fromhex(hexdigest) if hexdigest else bytes(16)
    return torch.tensor(list(raw), dtype=torch.uint8, device=device)
