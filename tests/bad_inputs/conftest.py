"""The bad-input suite: each test runs the real entry point on one bad input or fault and checks
what a user sees: the exit code, stderr as one line naming the culprit, and the seconds to fail.

`refused(result, *names)` is the check every preflight case shares. Bounds on seconds are loose
(this machine is shared and slow); the figures the note quotes come from these runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_RUN, need_data, row, run_main, tail

PREFLIGHT_S = 30  # the real preflight takes ~1 s (no tokenizer needed) to ~7 s (transformers' import)


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def small_run(tmp_path: Path) -> list[str]:
    """A one-step run on 20 good rows: each test swaps in its one bad part."""
    good = jsonl(tmp_path / "good.jsonl", [row(i) for i in range(20)])
    return [f"data.train_files={good}", f"data.val_files={good}", *TINY_RUN, "trainer.total_training_steps=1",
            f"hydra.run.dir={tmp_path / 'run'}"]


def timed_main(*args: str, env: dict | None = None, cwd: Path | None = None, fault: str | None = None,
               fresh: bool = True):
    """run_main in a new interpreter, with the seconds it took as a user would wait them; `env` adds to the
    run's environment, `fault` is run_main's; fresh=False: forked where it can be (a bound the imports do not
    decide)."""
    start = time.monotonic()
    result = run_main(*args, cwd=cwd, env=env, fault=fault, fresh=fresh)
    return result, time.monotonic() - start


def refused(result, seconds: float, *names: str, bound: float = PREFLIGHT_S) -> str:
    """Exit 2, stderr exactly one `error:` line containing every one of `names`, within `bound` s."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, tail(result)
    assert len(lines) == 1, tail(result)
    assert lines[0].startswith("error: "), lines
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert seconds < bound, f"{seconds:.1f} s to fail: {lines[0]}"
    return lines[0]


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    """The embedded tiny model's checkpoint directory (built on first use), to copy and break."""
    from logicrl.models.loading import checkpoint_dir
    from logicrl.models.tiny import EMBEDDED_TINY

    return checkpoint_dir(EMBEDDED_TINY)


@pytest.fixture(scope="module", autouse=True)
def role_data():
    need_data("kk_role")
