"""The time plan (logicrl/timeplan/): the device table, the calibration's cache, decoding memory-bound on a GPU
against a hand computation, the printed line, and the closing comparison naming a phase off by > 2x."""

import datetime
import json

import pytest

from logicrl.timeplan import calibrate
from logicrl.timeplan.calibrate import CpuRates, cpu_rates, matmul_rate
from logicrl.timeplan.devices import Device, device
from logicrl.timeplan.predict import Rates, Shape, generate_s
from logicrl.timeplan.report import TimePlan, plan_line, time_report


def test_device_table_prefers_the_longer_name():
    assert device("NVIDIA H100 PCIe").bf16_tflops == 756.0
    assert device("NVIDIA H100 80GB HBM3").bandwidth_gbs == 3350.0
    assert device("Some GPU") is None and device(None) is None


def test_calibration_is_cached_per_machine(tmp_path, monkeypatch):
    calls = []

    def fake(threads):
        calls.append(threads)
        return CpuRates({64: 1e9, 256: 3e9}, 2e9, 1e-6, 5e9, threads)

    monkeypatch.setattr(calibrate, "measure", fake)
    first, cached = cpu_rates(2, tmp_path)
    again, cached_again = cpu_rates(2, tmp_path)
    assert (cached, cached_again, calls) == (False, True, [2]) and again == first
    assert list(json.loads((tmp_path / "time_calibration.json").read_text()))[0].endswith("|threads 2")
    # widths between the measured ones are interpolated, outside them clamped
    assert matmul_rate(first, 160) == pytest.approx(2e9) and matmul_rate(first, 32) == 1e9
    assert matmul_rate(first, 4096) == 3e9


def test_decoding_on_a_gpu_is_memory_bound():
    # 1e9 weights, one layer, one response of 100 tokens after a 10-token prompt, on a device of 100 TFLOP/s
    # (40 at MFU 0.4) and 1000 GB/s (600 at 60%), with HF's engine (no wake-up, 2 ms a decoding step).
    shape = Shape(width=1024, matmul_params=10**9, lora_params=0, layers=1, attn_width=1024, params=10**9,
                  kv_per_token=1000)
    rates = Rates(gpu=Device("X", 100.0, 1000.0))
    kernels = (30 + 10) * 10e-6  # OPS_PER_LAYER x layers + OPS_ROOT, at 10 us each
    prefill = 2e9 * 10 / 40e12 + 2 * 1024 * 10 * 10 / 40e12 + kernels
    context = 10 + 100 / 2
    decode = (2e9 + context * 1000) / 600e9  # bf16 weights and the KV cache streamed once per token
    assert decode > (2e9 + 4 * 1024 * context) / 40e12  # memory-bound: the FLOPs take less
    expected = prefill + 100 * (decode + kernels + 0.002)
    assert generate_s(shape, rates, responses=1, prompt=10, response=100, max_seqs=256, engine="hf") == \
        pytest.approx(expected, rel=1e-12)


def test_plan_line():
    cpu = CpuRates({64: 50e9, 1024: 100e9}, 10e9, 1e-6, 5e9, 2)
    plan = TimePlan({"generate": 0.5, "update_actor": 1.25, "reward": 0.2, "advantages": 0.05}, Rates(cpu=cpu), 44, 4)
    now = datetime.datetime(2026, 1, 1, 10, 0, tzinfo=datetime.UTC)
    assert plan_line(plan, 100, now) == (
        "time plan: 2 s/step (update_actor 1.25, generate 0.5, other 0.25); 100 steps: 3m20s, ETA 10:03 UTC; "
        "prompts 44 + responses 4 tokens; CPU calibrated with 2 thread(s): matmul 50-100 GFLOP/s, 1.0 us per op")


def test_closing_report_names_a_phase_off_by_more_than_2x(tmp_path):
    # Step 1 (warm-up) is left out; steps 2-4: generate takes 3 s where 1 s was planned, the update as planned.
    rows = [{"step": s, "timing_s/step": 4.0, "timing_s/generate": 3.0 if s > 1 else 9.0,
             "timing_s/update_actor": 1.0} for s in range(1, 5)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = time_report({"generate": 1.0, "update_actor": 1.0}, tmp_path).splitlines()
    assert table[0] == "time per step (s): planned vs measured (median of 3 step(s), the first left out)"
    assert table[2].split() == ["generate", "1.000", "3.000", "3.00"]
    assert table[4].split() == ["step", "2.000", "4.000", "2.00"]
    assert table[-1] == "time plan off by more than 2x: generate (slower by 3.0x)"
    assert time_report({"generate": 1.0}, tmp_path / "none") is None
