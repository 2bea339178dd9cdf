"""This machine's CPU throughput, measured once (a few seconds) and cached per machine.

Three numbers make a CPU step: matmul FLOP/s as a function of the contraction width (a tiny model's
128-wide matmuls run far below a 2048-wide one's rate), causal attention FLOP/s (torch SDPA), and the
latency of one small op, which sets the time of a small model's many kernels (norms, rotary, residuals).
Plus memory bandwidth (a large copy) for the optimizer step and the weight sync. Measured with the
threads one rank gets, in the driver before Ray starts; cached in <cache root>/time_calibration.json
under the machine's name, CPU model, torch version and thread count.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

WIDTHS = (64, 128, 256, 512, 1024)
ROWS = 512  # tokens per calibration matmul: a micro-batch's order of magnitude
CACHE_FILE = "time_calibration.json"
FORMAT = 1


@dataclass(frozen=True)
class CpuRates:
    matmul_flops: dict  # width -> FLOP/s, fp32
    attention_flops: float  # FLOP/s of causal SDPA
    op_s: float  # seconds per small op
    bandwidth: float  # bytes/s
    threads: int


def _typical(fn, budget_s: float = 0.08, most: int = 50) -> float:
    """The median of up to `most` calls within about `budget_s`: on a shared machine, the speed a run gets
    while the others' work goes on (the fastest call would be the idle machine's)."""
    fn()  # warm-up: the first call pays for allocation and thread start-up
    times: list[float] = []
    while len(times) < most and (len(times) < 5 or sum(times) < budget_s):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(threads: int) -> CpuRates:
    """The rates at `threads` threads, each no lower than one thread's: on a busy machine OpenMP's threads
    can wait on each other's cores far longer than a run's steps do."""
    one = _measure(1)
    if threads <= 1:
        return one
    many = _measure(threads)
    return CpuRates({w: max(f, one.matmul_flops[w]) for w, f in many.matmul_flops.items()},
                    max(many.attention_flops, one.attention_flops), min(many.op_s, one.op_s),
                    max(many.bandwidth, one.bandwidth), threads)


def _measure(threads: int) -> CpuRates:
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        matmul = {}
        for w in WIDTHS:
            a, b = torch.randn(ROWS, w), torch.randn(w, w)
            matmul[w] = 2.0 * ROWS * w * w / _typical(lambda a=a, b=b: a @ b)
        q = torch.randn(4, 4, 256, 64)
        attn = 2.0 * 4 * 4 * 256 * 256 * 64  # QK^T and AV, each half of L x L (causal)
        attention = attn / _typical(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True))
        small = torch.randn(16, 16)
        ops = 200
        op_s = _typical(lambda: [small.add(small) for _ in range(ops)]) / ops
        big = torch.empty(8 * 2**20)
        bandwidth = 2 * big.numel() * 4 / _typical(lambda: big.clone())  # read + write
    finally:
        torch.set_num_threads(before)
    return CpuRates(matmul, attention, op_s, bandwidth, threads)


def _machine_key(threads: int) -> str:
    import torch

    cpu = platform.machine()  # not processor(): it may run `uname -p`
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}|{cpu}|torch {torch.__version__}|threads {threads}"


def cache_root() -> Path:
    return Path(os.environ.get("LOGICRL_CACHE", Path.home() / ".cache" / "logicrl"))


def cpu_rates(threads: int, cache: Path | None = None, fresh: bool = False) -> tuple[CpuRates, bool]:
    """(this machine's rates at `threads` threads, whether they came from the cache); `fresh` measures again
    and replaces the cached rates (benchmarks/time_plan.py, before each case on a shared machine)."""
    path = (cache or cache_root()) / CACHE_FILE
    key = _machine_key(threads)
    try:
        saved = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        saved = {}
    row = saved.get(key)
    if row and row.get("format") == FORMAT and not fresh:
        row = {k: v for k, v in row.items() if k != "format"}
        row["matmul_flops"] = {int(k): v for k, v in row["matmul_flops"].items()}
        return CpuRates(**row), True
    rates = measure(threads)
    saved[key] = {"format": FORMAT, **asdict(rates)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(saved, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only cache: measured again next time
    return rates, False


def matmul_rate(rates: CpuRates, width: int) -> float:
    """FLOP/s of a matmul contracting over `width`, interpolated between the measured widths."""
    points = sorted(rates.matmul_flops.items())
    if width <= points[0][0]:
        return points[0][1]
    for (w0, f0), (w1, f1) in zip(points, points[1:]):
        if width <= w1:
            return f0 + (f1 - f0) * (width - w0) / (w1 - w0)
    return points[-1][1]
