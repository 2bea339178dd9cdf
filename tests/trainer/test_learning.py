"""The embedded default learns: reward climbs well past where training with the update off stays.

Both runs use the same seeds, data and sampling; the baseline only switches the actor update off
(trainer.critic_warmup beyond the last step keeps the actor frozen).
"""

import json
import statistics

import pytest

from tests.conftest import ROOT, run_main

pytestmark = pytest.mark.slow
STEPS = 80
RUN = ["trainer.total_training_steps=80", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
       "trainer.test_freq=-1", "trainer.seed=7"]


def accuracy(tmp_path, name, *overrides):
    run_dir = tmp_path / name
    result = run_main(*RUN, *overrides, f"hydra.run.dir={run_dir}", cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    acc = [r["reward/acc/mean"] for r in rows]
    return statistics.mean(acc[:10]), statistics.mean(acc[-10:])


def test_reward_climbs_only_with_updates(tmp_path):
    if not (ROOT / "data/kk_role/train.parquet").is_file():
        pytest.skip("data/kk_role is missing: run `make data`")
    first, last = accuracy(tmp_path, "learn")
    base_first, base_last = accuracy(tmp_path, "frozen", f"trainer.critic_warmup={STEPS + 1}")
    print(f"with updates: {first:.2f} -> {last:.2f}; update off: {base_first:.2f} -> {base_last:.2f}")
    assert last > first + 0.3
    assert last > base_last + 0.3
    assert abs(base_last - base_first) < 0.15  # the frozen policy stays near chance
