"""The time plan: predicted seconds per phase and per step, before anything loads, beside the memory plan.

    devices.py     peak bf16 FLOP/s and memory bandwidth per GPU model
    calibrate.py   this CPU's matmul, attention and per-op throughput, measured once and cached per machine
    predict.py     seconds per phase from the step plan, the models' shapes and those rates
    report.py      the `time plan:` line, and the closing comparison with what the run measured
"""
