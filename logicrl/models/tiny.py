"""The embedded tiny model: a Qwen2-shaped decoder built from this config with random weights.

Sized for CPU tests and `make train`: small enough to train in minutes on 2 cores, big enough to
exercise every code path (GQA, tied embeddings, q/k/v biases). head_dim is 64 because vLLM's CPU
attention rejects some head sizes (16 fails). max_position_embeddings covers the Logic-RL recipes'
400 + 4096 tokens so they can be dry-run with it.

`tiny_checkpoint_dir()` turns it into a local checkpoint directory (config.json and the
tokenizer of tiny_tokenizer.py), so the tiny model loads through the same AutoConfig /
AutoTokenizer path as any user checkpoint. This module stays import-light: the preflight reads
TINY_CONFIG before torch or transformers are imported.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

# The model path that names this model (actor_rollout_ref.model.path=embedded:tiny). Defined here, the
# lowest layer that needs it; config/ validates paths against it (it already imports this module).
EMBEDDED_TINY = "embedded:tiny"
# The embedded reward model (reward_model.model.path=embedded:tiny_rm), built by models/tiny_rm.py.
EMBEDDED_TINY_RM = "embedded:tiny_rm"

TINY_CONFIG = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 352,
    "vocab_size": 2048,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}

# The embedded reward model: a Qwen2 sequence classifier with one label on the tiny tokenizer, half the
# actor's width; head_dim 64 as the actor's. No vLLM runs it, so its heads need not fill the hidden
# size: 4 heads over 3 layers is what finding the answer among random trailing tokens took (2 x 2
# agreed with the rule on 96% of held-out responses, 4 x 3 on 97%; models/tiny_rm.py). The vocabulary
# is the tokenizer's (tiny_rm.py writes the trained size, as for the actor).
TINY_RM_CONFIG = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForSequenceClassification"],
    "num_labels": 1,
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "intermediate_size": 176,
    "vocab_size": 2048,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}

# The trained tokenizer's size (tiny_tokenizer.py: what its corpus needs, below the cap above), which each
# checkpoint's config.json records (tests/models/test_tiny_tokenizer.py checks it): the memory plan's
# embeddings, log-prob chunks and sampler buffers are sized by it, not by the cap.
TINY_VOCAB = 763

# Every embedded name and the config.json it stands for: what the preflight reads before anything is built.
EMBEDDED_CONFIGS = {EMBEDDED_TINY: {**TINY_CONFIG, "vocab_size": TINY_VOCAB},
                    EMBEDDED_TINY_RM: {**TINY_RM_CONFIG, "vocab_size": TINY_VOCAB}}


# --- the checkpoint directory --------------------------------------------------------------
# Built on first use and cached. What is built here is config.json and the tokenizer files
# only, no weights: models/loading.py writes seeded random weights beside them on first load.


def tiny_fingerprint() -> str:
    """Short hash of everything the directory is built from: TINY_CONFIG and the tokenizer recipe."""
    from logicrl.models.tiny_tokenizer import RECIPE, recipe_text

    blob = json.dumps({"config": TINY_CONFIG, "tokenizer": RECIPE, "text": recipe_text()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else $LOGICRL_CACHE, else ~/.cache/logicrl."""
    return Path(cache_dir or os.environ.get("LOGICRL_CACHE") or Path.home() / ".cache" / "logicrl")


def tiny_checkpoint_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The tiny model's directory (config.json + tokenizer), built once under the cache root.

    Safe under concurrent test processes: each builds into its own temporary directory and
    renames it into place; rename is atomic, so a reader sees a complete directory or none,
    and a process that loses the race throws its (identical) copy away.
    """
    return build_once(cache_root(cache_dir) / f"tiny-{tiny_fingerprint()}", _write_checkpoint)


def build_once(final: Path, write) -> Path:
    """`final`, written by `write(directory)` unless it holds a config.json already (see tiny_checkpoint_dir)."""
    if (final / "config.json").is_file():
        return final
    with exclusive(final.parent / f".{final.name}.lock"):
        if (final / "config.json").is_file():  # built by the process this one waited for
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            write(tmp)
            try:
                os.rename(tmp, final)
            except OSError:
                # Renaming onto a non-empty directory fails: another process finished first.
                if not (final / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextlib.contextmanager
def exclusive(lock: Path):
    """An exclusive lock on the file `lock` (created if absent) for the block: processes building one
    cache entry at once (a sweep's jobs, a run's ranks, parallel tests) wait for the first instead of
    repeating its minutes of work. The rename into place still guards readers that take no lock."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file closes, even if the process dies
        try:
            yield
        finally:
            # Removed by its holder: a process still waiting on this inode finds the entry built once
            # it gets the lock, and a later one finds it built before it looks for a lock.
            lock.unlink(missing_ok=True)


def load_tiny_tokenizer(cache_dir: str | os.PathLike | None = None):
    """The tiny tokenizer, through AutoTokenizer as any local checkpoint's would be; offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_checkpoint_dir(cache_dir)), local_files_only=True)


def _write_checkpoint(path: Path) -> None:
    from logicrl.models.tiny_tokenizer import train_tiny_tokenizer

    tokenizer = train_tiny_tokenizer(TINY_CONFIG["vocab_size"])
    tokenizer.save_pretrained(path)
    # As in Qwen2.5-Instruct: no BOS is prepended, but bos_token_id names <|endoftext|>; the
    # chat eos is <|im_end|>. vocab_size is the trained size, at most TINY_CONFIG's.
    config = {**TINY_CONFIG, "vocab_size": len(tokenizer),
              "bos_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
