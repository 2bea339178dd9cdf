"""The console a person reads: the plan, one line per step under the bar, logicrl's warnings, the
result; vLLM's and Ray's own output only in the run directory's log file (logicrl/logs.py)."""

import logging
import os
import re
import subprocess
import sys

import pytest

from logicrl.logs import lines_above, quiet_driver, run_log_file
from logicrl.trainer.tracking import Tracker
from tests.conftest import MEMORY_BAND, ROOT, peak_over_plan, read_metrics, run_main, tail

LEARN_STEPS = 30


def tracker(tmp_path, total_steps):
    return Tracker(tmp_path, ["console"], total_steps, {}, "p", "e")


def test_bar_counts_training_steps_not_validation_before_training(tmp_path):
    t = tracker(tmp_path, 3)
    for step in range(4):  # step 0 is validation before training
        t.log({"val/acc": 0.5}, step)
    assert (t.bar.n, t.bar.total) == (3, 3)  # not 4 of 3 ("4step" on the final line)
    t.close()


def test_resumed_bar_starts_where_the_run_stands(tmp_path):
    t = tracker(tmp_path, 5)
    t.log({}, 4)
    assert (t.bar.n, t.bar.initial) == (4, 3)  # the rate counts the steps this process ran
    t.log({}, 5)
    assert t.bar.n == 5
    t.close()


def test_lines_printed_while_the_bar_is_up_go_above_it(capsys):
    from tqdm import tqdm

    bar = tqdm(total=2, desc="steps")  # on (captured) stderr, as the tracker's
    hydra_console = logging.StreamHandler(sys.stdout)  # what Hydra puts on the root logger
    logging.getLogger().addHandler(hydra_console)
    try:
        with lines_above(bar):
            print("step 1: reward 0.5")
            print("(HybridWorker pid=1) rank 0: update_actor ran out of memory", file=sys.stderr)  # as Ray prints
            logging.getLogger("logicrl.trainer").warning("saved global_step_1")
    finally:
        logging.getLogger().removeHandler(hydra_console)
    bar.close()
    out, err = capsys.readouterr()
    assert out == "step 1: reward 0.5\nsaved global_step_1\n"
    assert hydra_console.stream is sys.stdout  # given back
    segments = err.split("\r")  # the bar redraws itself after \r; a line glued onto it would share its segment
    assert any(s.startswith("(HybridWorker pid=1) rank 0: update_actor") for s in segments), err


@pytest.mark.integration
def test_worker_output_goes_to_the_file_and_logicrl_lines_to_the_console(tmp_path):
    """In a fresh process, as in a Ray worker: everything on fds 1 and 2 moves to the file."""
    log_file = tmp_path / "main_ppo.log"
    code = f"""
import logging, os, sys
from logicrl.logs import quiet_worker
quiet_worker({str(log_file)!r}, rank=1)
print("engine print")
logging.getLogger("vllm").warning("ParallelLMHead: Failed to load weights")
os.write(2, b"C++ warning\\n")
logging.getLogger("logicrl.workers").warning("gen ran out of memory: a 8 -> 4")
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    assert re.fullmatch(r"\[.*\]\[logicrl.workers\]\[WARNING\] - rank 1: gen ran out of memory: a 8 -> 4\n",
                        result.stderr)
    written = log_file.read_text()
    for line in ("engine print", "Failed to load weights", "C++ warning", "rank 1: gen ran out of memory"):
        assert line in written, line


@pytest.fixture
def ray_logger():
    """The `ray` logger as Ray leaves it at import (one stderr handler, no propagation), restored after."""
    logger = logging.getLogger("ray")
    saved = logger.handlers, logger.propagate, logger.level
    logger.handlers, logger.propagate = [logging.StreamHandler(sys.stderr)], False
    logger.setLevel(logging.INFO)
    yield logger
    for h in logger.handlers:
        if isinstance(h, logging.FileHandler):
            h.close()
    logger.handlers, logger.propagate = saved[:2]
    logger.setLevel(saved[2])


def test_verbose_leaves_the_console_as_the_engines_set_it(tmp_path, ray_logger):
    assert quiet_driver(tmp_path, verbose=True) is None  # the workers get no log file: nothing moves
    assert ray_logger.handlers[0].level == logging.NOTSET
    assert not [h for h in ray_logger.handlers if isinstance(h, logging.FileHandler)]


def test_quiet_driver_sends_ray_info_to_the_file(tmp_path, ray_logger):
    log_file = quiet_driver(tmp_path, verbose=False)
    assert log_file == str(run_log_file(tmp_path)) == str(tmp_path / "logicrl.log")  # no Hydra file handler here
    assert quiet_driver(tmp_path, verbose=False) == log_file  # a second stage adds no second handler
    quiet_driver(tmp_path / "job1", verbose=False)  # a multirun's next job: its own file only
    assert [h.baseFilename for h in ray_logger.handlers if isinstance(h, logging.FileHandler)] == \
        [str(tmp_path / "job1" / "logicrl.log")]
    log_file = quiet_driver(tmp_path, verbose=False)
    assert ray_logger.handlers[0].level == logging.WARNING  # Ray's own stderr handler: warnings only
    assert [h.baseFilename for h in ray_logger.handlers if isinstance(h, logging.FileHandler)] == [log_file]
    ray_logger.info("Started a local Ray instance.")
    assert "Started a local Ray instance." in (tmp_path / "logicrl.log").read_text()


@pytest.mark.integration
def test_default_run_console_is_readable_and_it_learns(kk_role, tmp_path):
    """The real entry point on the embedded default (GRPO, the vLLM engine), as `make train` runs it, for 30
    steps: it learns (validation accuracy from chance to >= 0.9; make train's take-off is around step 20),
    and the console has the plan, one line per step, the bar ending at the step count, an injected OOM's
    warning from the worker, and no engine or Ray chatter, which is all in the run's log file. The same run
    checks the metrics, the engine's log-probs after a weight sync, the curves and TensorBoard. (Its
    two-rank, truncated 3-step version was this test before; two ranks on vLLM: test_train_integration.py's
    2-tp2, truncation's counts: tests/data/test_dataset_loading.py.)"""
    run_dir = tmp_path / "run"
    result = run_main(*kk_role, f"trainer.total_training_steps={LEARN_STEPS}", "trainer.test_freq=5",
                      f"hydra.run.dir={run_dir}", fault="oom@update_actor:1", cwd=tmp_path)
    assert result.returncode == 0, tail(result)
    console = result.stdout + result.stderr
    assert "memory plan per device" in result.stdout  # the plan
    assert re.findall(r"^step (\d+):", result.stdout, re.MULTILINE) == [str(s) for s in range(LEARN_STEPS + 1)]
    assert f"{LEARN_STEPS} steps done" in result.stdout  # the result
    # the bar ends at the step count
    assert f"{LEARN_STEPS}/{LEARN_STEPS}" in result.stderr and f"{LEARN_STEPS + 1}/{LEARN_STEPS}" not in result.stderr
    assert "update_actor ran out of memory" in console  # logicrl's worker-side warning still shows
    for noise in ("Failed to load weights", "reset prefix cache", "(MainProcess pid=", "Loading safetensors",
                  "Started a local Ray instance"):
        assert noise not in console, noise
    assert "auth" not in console.lower()
    log = (run_dir / "main_ppo.log").read_text()
    for line in ("reset prefix cache", "Started a local Ray instance", "update_actor ran out of memory"):
        assert line in log, line
    # vLLM's warning for the layers no sync writes (the rotary cache, the tied lm_head) reads as an error:
    # dropped at its source (workers/rollout/vllm.py ExpectedAbsent), so the log has none either.
    assert "Failed to load weights" not in log
    assert re.search(r"^time plan: [0-9.]+ s/step", result.stdout, re.MULTILINE)  # beside the memory plan
    assert "time per step (s): planned vs measured" in result.stdout  # and checked after the run
    # The memory plan checked after the run too: each phase's tensor peak (steps 1, 10, 20, 30) within the band
    # of the plan for what those steps ran (their lengths, and update_actor's micro-batch the OOM halved).
    ratios = peak_over_plan(result.stdout)
    assert set(ratios) == {"generate", "update_actor", "update_weights"}, ratios
    assert all(MEMORY_BAND[0] <= r <= MEMORY_BAND[1] for r in ratios.values()), ratios

    rows = read_metrics(run_dir)
    val = {r["step"]: r["val/acc"] for r in rows if "val/acc" in r}
    print(f"validation accuracy by step: {val}")
    assert sorted(val) == list(range(0, LEARN_STEPS + 1, 5))
    assert val[0] < 0.6 and max(val.values()) >= 0.9  # chance is 0.5: one of two role words
    last = rows[-1]
    assert last["step"] == LEARN_STEPS
    assert (last["data/prompts_truncated"], last["data/prompts_filtered"], last["data/rows_skipped"]) == (0, 0, 0)
    for key in ("critic/score/mean", "reward/acc/mean", "actor/grad_norm", "actor/entropy", "response_length/mean",
                "timing_s/generate", "timing_s/update_actor", "timing_s/update_weights",
                "perf/memory/generate/rss_peak_gb", "perf/memory/update_actor/rss_peak_gb",
                "perf/memory/generate/tensor_peak_gb", "perf/memory/update_actor/tensor_peak_gb"):  # step 30: tracked
        assert key in last, key
    # One optimizer step per step: the old-log-prob pass is provably redundant and skipped.
    assert "timing_s/old_log_prob" not in last
    # Each step samples from the weights the step before synced into the engine.
    assert last["rollout/logprob_diff_max"] < 1e-3
    assert (run_dir / "curves.png").stat().st_size > 0
    assert list((run_dir / "tensorboard").iterdir())
