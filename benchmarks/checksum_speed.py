"""Bytes per second of each candidate checksum for checkpoint files, on this machine.

    .venv/bin/python benchmarks/checksum_speed.py [--mb 256] [--chunk-mb 4] [--repeats 3]

A checkpoint's checksum is computed as its files are written (logicrl/checksums.py), in the chunks the
writers hand to the file: one tensor's bytes for DCP's shards and the HF export. The chunk size is set
here to what those writes look like (MBs, not KBs). Each candidate hashes the same random buffer; the
median of the repeats is printed with the time it would add to a 15 GB save (a 7B model's bf16 export)
and to the write itself, measured as one buffered write of the same bytes into a temporary file
(page cache: the fastest a disk can take them). The figure chosen is in docs/faults.md.
"""

import argparse
import hashlib
import os
import statistics
import tempfile
import time
import zlib


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


def main() -> None:
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
    print(f"{'write to page cache':<18} {written / 1e9:6.2f} GB/s   {save_gb / (written / 1e9):6.1f} s per {save_gb} GB")
    for name, (make, update) in candidates().items():
        r = rate(make, update, data, chunk, args.repeats)
        print(f"{name:<18} {r / 1e9:6.2f} GB/s   {save_gb / (r / 1e9):6.1f} s per {save_gb} GB")


if __name__ == "__main__":
    main()
