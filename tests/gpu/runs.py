"""The GPU tier's way to run logicrl's real trainer: composed, validated and planned as main_ppo.py
does, then PPOTrainer's step loop over one in-process rank (local_group.py: the lent GPU machines
have no Ray). Also usable on CPU, which is how this helper itself is checked before a GPU is lent:

    .venv/bin/python -m tests.gpu.runs [override ...]
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.conftest import BASE_BATCH, write_jsonl
from tests.gpu.local_group import LocalGroup

# Two steps of the trainer on the GPU with the hf engine, saved at the end (tests/gpu/test_train_cuda.py);
# the embedded default's values (GRPO, its batch and lr) over the checkpoint each test names.
TWO_STEPS = ["preset=embedded", "trainer.total_training_steps=2", "trainer.device=cuda",
             "actor_rollout_ref.rollout.name=hf", "trainer.val_before_train=false", "trainer.test_freq=-1",
             "trainer.save_freq=2"]
# A Qwen2.5-0.5B-shaped model (494M parameters) with random weights: the GPU tier's realistic size.
QWEN25_05B = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], hidden_size=896, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                  max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  head_dim=64)


def write_random_model(shape: dict, directory: Path, seed: int = 0) -> Path:
    """config.json, seeded random weights, and the embedded tiny model's tokenizer (its 2048 ids all
    fall inside any vocabulary at least that large)."""
    import torch
    import transformers

    from logicrl.models.loading import checkpoint_dir

    if (directory / "config.json").is_file():
        return directory
    config = transformers.AutoConfig.for_model(**shape)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(directory)
    transformers.AutoTokenizer.from_pretrained(checkpoint_dir("embedded:tiny")).save_pretrained(directory)
    return directory


def train(overrides: list[str], root: Path) -> list[dict]:
    """Train with `overrides` (on top of a small jsonl data set and BASE_BATCH) under `root`; returns
    the rows of metrics.jsonl, one per step."""
    from logicrl.config import compose, validate
    from logicrl.preflight.memory import check_memory
    from logicrl.trainer.ppo import PPOTrainer

    train_file = write_jsonl(root / "data" / "train.jsonl", 16)
    val_file = write_jsonl(root / "data" / "test.jsonl", 4)
    cfg, spec, plan = validate(compose([f"data.train_files={train_file}", f"data.val_files={val_file}", *BASE_BATCH,
                                        f"trainer.default_local_dir={root / 'ckpt'}", "trainer.logger=[console]",
                                        *overrides]))
    plan = check_memory(cfg, spec, plan).plan
    run_dir = root / "run"
    PPOTrainer(cfg, plan, run_dir, group_cls=LocalGroup).fit()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        rows = train(sys.argv[1:], Path(tmp))
        for row in rows:
            print({k: round(v, 4) for k, v in row.items() if isinstance(v, float) and
                   (k.startswith(("timing_s/", "critic/score", "perf/memory/")) and k.endswith(("peak_gb", "mean")) or
                    k.startswith("timing_s/"))})
