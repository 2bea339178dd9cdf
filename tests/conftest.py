"""Shared fixtures and the test tiers (unit by default; integration, slow and gpu markers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch  # only paid for when a gpu test was selected

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh tiny-model cache directory (tokenizer built from scratch) per test module."""
    return tmp_path_factory.mktemp("logicrl-cache")


@pytest.fixture(scope="module")
def tokenizer(cache):
    from logicrl.models.tiny import load_tiny_tokenizer

    return load_tiny_tokenizer(cache)


def write_jsonl(path: Path, rows: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"puzzle {i}"}], "data_source": "kk_role",
                                "reward_model": {"style": "rule", "ground_truth": {"name": "Zoey", "role": "knight"}}})
                    + "\n")
    return path


# The batch the config tests' hand-computed numbers assume, pinned so that retuning the embedded
# default does not change them: 8 prompts x 4 responses, mini-batches of 4 prompts, micro 4.
BASE_BATCH = ["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"]


@pytest.fixture
def data_files(tmp_path) -> list[str]:
    """Overrides pointing data.train_files/val_files at small jsonl sets (20 train rows, 4 val rows),
    with BASE_BATCH (later overrides of the same keys win)."""
    train = write_jsonl(tmp_path / "data" / "train.jsonl", 20)
    val = write_jsonl(tmp_path / "data" / "test.jsonl", 4)
    return [f"data.train_files={train}", f"data.val_files={val}", *BASE_BATCH]


def run_main(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real entry point as a user would; Hydra's run dir goes under cwd (a tmp dir)."""
    if not any(a.startswith("trainer.default_local_dir=") for a in args):
        # Checkpoints are on by default and resume_mode=auto: a shared directory would make one
        # test resume from another's run.
        args = (*args, f"trainer.default_local_dir={tempfile.mkdtemp(prefix='logicrl-ckpt-')}")
    return subprocess.run([sys.executable, str(ROOT / "main_ppo.py"), *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0"})
