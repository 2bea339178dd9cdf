"""Bytes per second of each candidate checksum for checkpoint files, on this machine, and what the
chosen one adds to a real save.

    .venv/bin/python benchmarks/checksum_speed.py [--mb 256] [--chunk-mb 4] [--repeats 3]

A checkpoint's checksum is computed as its files are written (logicrl/checksums.py), in the chunks the
writers hand to the file: one tensor's bytes for DCP's shards and the HF export. The chunk size is set
here to what those writes look like (MBs, not KBs). Each candidate hashes the same random buffer; the
median of the repeats is printed with the time it would take for a 15 GB save (a 7B model's bf16
export), beside one buffered write of the same bytes into a temporary file (page cache: the fastest a
disk can take them). Then the same bytes as tensors go through DCP's writer and the safetensors
export, with and without the checksum (workers/checkpoint.py). The figures quoted are in docs/faults.md.
"""

import argparse
import hashlib
import os
import statistics
import tempfile
import time
import warnings
import zlib
from pathlib import Path


def candidates() -> dict:
    """name -> (make a state, update it with a chunk). zlib.crc32 carries an int, hashlib an object."""
    out = {"zlib.crc32": (lambda: [0], lambda s, b: s.__setitem__(0, zlib.crc32(b, s[0])))}
    for name in ("md5", "sha1", "sha256", "blake2b", "blake2s"):
        out[f"hashlib.{name}"] = (lambda n=name: hashlib.new(n), lambda h, b: h.update(b))
    return out


def rate(make, update, data: memoryview, chunk: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        state = make()
        start = time.perf_counter()
        for i in range(0, len(data), chunk):
            update(state, data[i:i + chunk])
        times.append(time.perf_counter() - start)
    return len(data) / statistics.median(times)


def write_rate(data: memoryview, repeats: int) -> float:
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            path = os.path.join(tmp, f"w{i}")
            start = time.perf_counter()
            with open(path, "wb") as f:
                f.write(data)
            times.append(time.perf_counter() - start)
            os.unlink(path)
    return len(data) / statistics.median(times)


def save_cost(mb: int, repeats: int) -> None:
    """Seconds to save `mb` MiB of fp32 tensors: DCP's plain writer against the summing one, and
    safetensors' save_file against the streaming writer."""
    import torch
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    from logicrl.checksums import Checksums
    from logicrl.workers.checkpoint import _SummingWriter
    from logicrl.workers.hf_export import write_safetensors

    state = {f"w{i}": torch.randn(1024, 1024) for i in range(mb // 4)}  # 4 MiB each

    def timed(save) -> float:
        times = []
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                start = time.perf_counter()
                save(tmp)
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    def summed_dcp(tmp):
        with Checksums(tmp, "rank0") as sums:
            dcp.save(state, storage_writer=_SummingWriter(Path(tmp), sums))

    def summed_st(tmp):
        with Checksums(tmp, "rank0") as sums:
            write_safetensors(Path(tmp) / "m.safetensors", state, sums)

    rows = [("DCP FileSystemWriter", lambda tmp: dcp.save(state, storage_writer=dcp.FileSystemWriter(tmp))),
            ("DCP summing writer", summed_dcp),
            ("safetensors save_file", lambda tmp: save_file(state, f"{tmp}/m.safetensors")),
            ("streamed + crc32", summed_st)]
    for name, save in rows:
        print(f"{name:<22} {timed(save):6.2f} s for {mb} MiB (fsync included where the writer does it)")


def main() -> None:
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process: DCP says so
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=256, help="bytes hashed per repeat, in MiB")
    parser.add_argument("--chunk-mb", type=float, default=4, help="bytes per update call, in MiB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = memoryview(os.urandom(args.mb << 20))
    chunk = int(args.chunk_mb * (1 << 20))
    save_gb = 15
    print(f"{args.mb} MiB in {args.chunk_mb:g} MiB chunks, median of {args.repeats}; os.cpu_count()={os.cpu_count()}")
    written = write_rate(data, args.repeats)
    gbps = written / 1e9
    print(f"{'write to page cache':<18} {gbps:6.2f} GB/s   {save_gb / gbps:6.1f} s per {save_gb} GB")
    for name, (make, update) in candidates().items():
        r = rate(make, update, data, chunk, args.repeats)
        print(f"{name:<18} {r / 1e9:6.2f} GB/s   {save_gb / (r / 1e9):6.1f} s per {save_gb} GB")
    save_cost(args.mb, args.repeats)


if __name__ == "__main__":
    main()
