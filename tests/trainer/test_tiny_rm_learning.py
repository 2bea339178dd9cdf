"""`python main_ppo.py +recipe=tiny_rm_ppo` learns from the reward model's score alone: the rule's accuracy
(reported, never rewarded: reward.combine.mode=model) climbs in training and validation, and curves.png draws
it; the same run with the actor update off (trainer.critic_warmup past the last step: the critic still trains)
stays at chance.

Measured (2 CPU cores, tiny_rm already cached, the recipe's four epochs a step and cosine decay). With the
update: train accuracy (mean of the first / last 10 steps) 0.52 -> 0.99; validation accuracy (greedy, 200
prompts) 0.47 at step 0, 1.0 at step 60. Update off: train 0.48 -> 0.48, validation 0.47 at every test.
Both runs: 448 s. Other seeds and other reward-model builds: benchmarks/tiny_rm_seeds.py (docs/testing.md:
15 of 15 runs at 1.0 at step 60, all but one by step 30).
The thresholds keep a margin for the per-step noise (about 0.044 on 128 responses, 0.014 on a 10-step
mean: binomial, p = 0.5).
"""

import statistics

import pytest

from logicrl.trainer.curves import curve_points
from tests.conftest import MEMORY_BAND, peak_over_plan, run_main, tail

pytestmark = pytest.mark.slow
STEPS = 60  # the recipe's; it takes off around step 10-15


def run(tmp_path, name, *overrides):
    run_dir = tmp_path / name
    # Each run its own checkpoint directory: resume_mode=auto would otherwise resume from the other run.
    result = run_main("+recipe=tiny_rm_ppo", "trainer.logger=[jsonl]", *overrides, ckpt=run_dir / "ckpt",
                      run_dir=run_dir, timeout=1200)
    assert result.returncode == 0, tail(result)
    # The recipe's closing memory table: every phase's tensor peak (steps 1, 10, ... 60) within the planner's band.
    ratios = peak_over_plan(result.stdout)
    assert ratios and all(MEMORY_BAND[0] <= r <= MEMORY_BAND[1] for r in ratios.values()), ratios
    points = curve_points(run_dir)  # what curves.png draws
    train = [acc for _, acc in points["train accuracy"]]
    val = dict(points["validation accuracy"])
    assert len(train) == STEPS and sorted(val) == list(range(0, STEPS + 1, 10))
    return run_dir, statistics.mean(train[:10]), statistics.mean(train[-10:]), val


def test_the_policy_learns_from_the_reward_model_only_with_its_update(kk_role, tiny_rm, tmp_path):
    run_dir, first, last, val = run(tmp_path, "learn")
    _, frozen_first, frozen_last, frozen_val = run(tmp_path, "frozen", f"trainer.critic_warmup={STEPS + 1}")
    print(f"train acc {first:.3f} -> {last:.3f}, val acc {val[0]:.3f} -> {val[STEPS]:.3f}; update off: "
          f"train {frozen_first:.3f} -> {frozen_last:.3f}, val {frozen_val[0]:.3f} -> {frozen_val[STEPS]:.3f}")
    assert (run_dir / "curves.png").stat().st_size > 10_000
    assert first < 0.6 and last > 0.85  # chance is 0.5: one of two role words
    assert val[0] < 0.6 and val[STEPS] > 0.9
    assert last > frozen_last + 0.3
    # Frozen: the same greedy policy at every validation, and training samples that stay at chance.
    assert abs(frozen_last - frozen_first) < 0.1 and frozen_last < 0.6
    assert max(frozen_val.values()) - min(frozen_val.values()) < 0.05
