"""reward/pool.py: a reward's bad value, exception or exit named in one line (in this process: unit tier), and
the pool's bound on a reward that hangs or kills its own process (worker processes: integration tier, no Ray)."""

from __future__ import annotations

import math
import time

import pytest

from logicrl.reward.pool import InlineScorer, PoolScorer, RewardFailed

KK = ("kk_role", "Zoey is a knight.", {"name": "Zoey", "role": "knight"}, {})

CUSTOM = '''
import math, os, sys, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    kind = solution_str.split(":")[0]
    if kind == "sleep":
        time.sleep(3600)
    if kind == "nan":
        return math.nan
    if kind == "inf":
        return {"score": math.inf}
    if kind == "none":
        return None
    if kind == "text":
        return "1.0"
    if kind == "list":
        return [1.0]
    if kind == "raise":
        raise ZeroDivisionError("division by zero")
    if kind == "exit":
        sys.exit(3)
    if kind == "die":
        os._exit(9)
    return {"score": float(len(solution_str)), "length": len(solution_str)}
'''


def custom_fn(tmp_path):
    from logicrl.reward.custom import load_custom_reward

    path = tmp_path / "my_reward.py"
    path.write_text(CUSTOM)
    return path, load_custom_reward(path, "compute_score")


def row(text: str) -> tuple:
    return ("chat", text, "ground", {"index": 7})


@pytest.mark.parametrize("text, says", [
    ("nan:x", "returned a non-finite score nan"),
    ("inf:x", "returned a non-finite score inf"),
    ("none:x", "returned score None, a NoneType"),
    ("text:x", "returned score '1.0', a str"),
    ("list:x", "returned score [1.0], a list"),
    ("raise:x", "raised ZeroDivisionError: division by zero"),
    ("exit:x", "called sys.exit(3)"),
])
def test_a_bad_value_names_the_function_the_response_and_the_value(tmp_path, text, says):
    path, fn = custom_fn(tmp_path)
    with pytest.raises(RewardFailed) as raised:
        InlineScorer(fn).score([row("fine"), row(text)])
    line = str(raised.value)
    assert f"custom reward compute_score in {path}" in line and says in line, line
    assert "on response 1 of the batch (data_source='chat', ground_truth='ground', response " in line, line
    assert "\n" not in line


def test_the_built_in_rewards_score_in_process():
    from logicrl.reward import compute_score

    results, timeouts = InlineScorer().score([KK])
    assert timeouts == 0 and results[0] == compute_score(*KK) and math.isfinite(results[0]["score"])


@pytest.mark.integration
def test_the_pool_scores_as_the_driver_would_and_ends_a_reward_past_its_time(tmp_path):
    path, fn = custom_fn(tmp_path)
    pool = PoolScorer(timeout_s=1.0, timeout_score=-2.5, custom_file=(str(path), "compute_score"), workers=2)
    try:
        rows = [row("ab"), row("sleep:1"), row("abcd"), row("sleep:2"), row("a")]
        start = time.monotonic()
        results, timeouts = pool.score(rows)
        seconds = time.monotonic() - start
        # Two sleepers in two workers: each killed after 1 s and replaced; the others scored as in-process.
        assert timeouts == 2 and seconds < 20, seconds
        assert [r["score"] for r in results] == [2.0, -2.5, 4.0, -2.5, 1.0]
        assert results[2] == InlineScorer(fn).score([row("abcd")])[0][0]
        # The replacements serve the next call (a built-in reward in a pool with a custom one: its own result).
        again, timeouts = pool.score([row("xyz")])
        assert timeouts == 0 and again[0]["score"] == 3.0
    finally:
        pool.close()


@pytest.mark.integration
@pytest.mark.parametrize("text, says", [
    ("exit:x", "called sys.exit(3)"),
    ("die:x", "the reward's process ended (exit code 9"),
    ("nan:x", "returned a non-finite score nan"),
])
def test_in_the_pool_an_exit_or_a_bad_value_is_one_line(tmp_path, text, says):
    path, _ = custom_fn(tmp_path)
    pool = PoolScorer(timeout_s=30, timeout_score=0.0, custom_file=(str(path), "compute_score"), workers=1)
    try:
        with pytest.raises(RewardFailed) as raised:
            pool.score([row("ok"), row(text)])
        assert says in str(raised.value) and "on response 1 of the batch" in str(raised.value), str(raised.value)
        assert pool.score([row("ok")])[0][0]["score"] == 2.0  # the pool still serves
    finally:
        pool.close()


@pytest.mark.integration
def test_the_built_in_rewards_score_in_the_pool():
    pool = PoolScorer(timeout_s=30, timeout_score=0.0, workers=1)
    try:
        assert pool.score([KK]) == InlineScorer().score([KK])
    finally:
        pool.close()
