"""Through the entry point: a vLLM that is installed but fails to import is planned for hf and generates
with hf, the one decision (config/engines.py resolve_engine) said in one line."""

import json
import os

import pytest

from logicrl.config.phases import ARR
from tests.conftest import ROLE_DATA, ROOT, TINY_RUN, run_main, tail

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kk_role")]
BROKEN = "libcudart.so.12: cannot open shared object file: No such file or directory"


def test_a_vllm_that_fails_to_import_trains_with_hf_as_planned(tmp_path):
    fake = tmp_path / "site"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text(f"raise ImportError({BROKEN!r})\n")
    path = os.pathsep.join(p for p in (str(fake), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    run_dir = tmp_path / "run"
    result = run_main(*ROLE_DATA, *TINY_RUN, f"{ARR}.rollout.name=vllm", "trainer.total_training_steps=1",
                      f"hydra.run.dir={run_dir}", cwd=tmp_path, env={"PYTHONPATH": path})
    assert result.returncode == 0, tail(result)
    line = f"{ARR}.rollout.name=vllm but importing vLLM failed (ImportError: {BROKEN}): generating with hf instead"
    out = result.stdout + result.stderr
    assert line in out
    # Planned as hf: its generate micro-batches, not vLLM's KV cache.
    assert "vLLM's KV cache" not in out
    rows = [json.loads(r) for r in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
