"""The model directories a run reads: weights present and whole (every model's: actor and reference,
critic, reward model), a model_type transformers knows, a tokenizer that loads, fits the vocabulary
and ends a response where the chat template ends the turn.

    check_weights(cfg, dry_run)              # first in the preflight: file headers only
    tokenizer = check_models(cfg, dry_run)   # None in a dry run: it imports no transformers

Each problem is one line naming the config key, the directory, what is wrong and the fix; found
later, a directory without weights would end inside a Ray actor with a long traceback, and a
tokenizer without an eos token would generate past the end of the chat turn, and a cut-short
safetensors file would fail to load inside a Ray actor after minutes of start-up. "Whole" is read from
the files' headers, never their data (models/weight_files.py). A dry run only warns about weights: it
may plan from a config-only directory (logicrl/memory/shapes/).
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from logicrl.config.errors import ConfigError
from logicrl.config.models import MODELS, in_use
from logicrl.config.plan import ARR
from logicrl.models.eos import end_of_turn, eos_ids
from logicrl.models.spec import ModelSpec, load_model_spec
from logicrl.models.tiny import EMBEDDED_CONFIGS, cache_root
from logicrl.models.weight_files import read_header, safetensors_problem, torch_bin_problem

log = logging.getLogger("logicrl.preflight")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def model_paths(cfg: DictConfig) -> list[tuple[str, str]]:
    """(key, path) of each model whose tokenizer the run loads."""
    paths = [(f"{ARR}.model.path", cfg[ARR].model.path)]
    if in_use(cfg)["critic"] and cfg.critic.model.path != cfg[ARR].model.path:
        paths.append(("critic.model.path", cfg.critic.model.path))
    rm = cfg.reward_model
    # Its tokenizer is read only to re-render rows (reward_model.model.input_tokenizer set): then it must load.
    if rm.enable and rm.model.input_tokenizer and rm.model.path != cfg[ARR].model.path:
        paths.append(("reward_model.model.path", rm.model.path))
    return paths


def weight_paths(cfg: DictConfig) -> list[tuple[str, str]]:
    """(key, path) of each model whose weights the run loads: the actor (and the reference, which
    shares its path), the critic, the reward model; the embedded models are built by logicrl itself."""
    paths = [(m.path_key, m.get(cfg, "path_key")) for m in MODELS if m.in_use(cfg)]
    seen: set[str] = set()
    return [(key, path) for key, path in paths
            if path not in EMBEDDED_CONFIGS and not (path in seen or seen.add(path))]


def check_weights(cfg: DictConfig, dry_run: bool) -> None:
    """Each model directory's weights, present and whole (headers only: milliseconds, so the
    preflight runs it first). Raises ConfigError; a dry run only warns."""
    for key, path in weight_paths(cfg):
        if problem := weights_problem(Path(path)):
            if not dry_run:
                raise ConfigError(f"{key}: {problem}")
            # A dry run may plan from a config-only directory (logicrl/memory/shapes/): say it, go on.
            log.warning(f"{key}: {problem} (a dry run plans without them; training needs them)")


def check_models(cfg: DictConfig, dry_run: bool):
    """Outside a dry run, each model directory's model_type and tokenizer (check_weights ran first).
    Returns the actor's tokenizer (None in a dry run); raises ConfigError."""
    tokenizer = None
    if not dry_run:
        for key, path in model_paths(cfg):
            loaded = _checked_tokenizer(key, path)
            tokenizer = tokenizer or loaded
    return tokenizer


@functools.lru_cache(maxsize=4)  # a curriculum's stages share their model
def _checked_tokenizer(key: str, path: str):
    from logicrl.models.loading import checkpoint_dir, load_tokenizer  # torch and transformers: the real run only

    spec = load_model_spec(path)
    if problem := model_type_problem(spec):
        raise ConfigError(f"{key}: {problem}")
    try:
        tokenizer = load_tokenizer(path)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds for a broken tokenizer
        if isinstance(err, OSError) and path in EMBEDDED_CONFIGS:  # built into the cache, not copied from anywhere
            raise ConfigError(f"{key}={path} is built into the cache directory {cache_root()} ($LOGICRL_CACHE, else "
                              f"~/.cache/logicrl), which cannot be written ({err.strerror or err}: {err.filename}): "
                              "set LOGICRL_CACHE to a writable directory") from None
        raise ConfigError(f"{key}={path}: the tokenizer does not load ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:200]}): copy the checkpoint's tokenizer files") from None
    if problem := tokenizer_problem(tokenizer, checkpoint_dir(path), spec):
        raise ConfigError(f"{key}: {problem}")
    if not getattr(tokenizer, "chat_template", None):
        log.info(f"{key}={path}: the tokenizer has no chat template: chat-list prompts become 'Role: content' lines "
                 "(logicrl/data/prompts.py)")
    return tokenizer


def weights_problem(directory: Path) -> str | None:
    """Why `directory` holds no loadable weights, or None: safetensors or .bin files, every shard an
    index lists, each file whole (headers only: weight_files.py; a legacy non-zip .bin is not checked)."""
    for name in INDEX_FILES:
        index = directory / name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                shards = sorted(set(weight_map.values()))
            except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as err:
                return f"{index} is not a weight index ({type(err).__name__}): re-export the checkpoint"
            missing = [s for s in shards if not (directory / s).is_file()]
            if missing:
                more = f" and {len(missing) - 1} more shard(s)" if len(missing) > 1 else ""
                return f"{directory} lacks {missing[0]}{more}, listed in {name}: copy the whole checkpoint"
            for shard in shards:
                if problem := file_problem(directory / shard):
                    return problem
            return _index_problem(directory, index, weight_map) if name.endswith(".safetensors.index.json") else None
    files = sorted(p for pattern in WEIGHT_PATTERNS for p in directory.glob(pattern) if p.is_file())
    if not files:
        return (f"{directory} has config.json but no weights (*.safetensors or pytorch_model*.bin): copy the "
                "checkpoint's weight files there")
    return next((problem for path in files if (problem := file_problem(path))), None)


def file_problem(path: Path) -> str | None:
    """Why one weight file is not whole, or None."""
    return safetensors_problem(path) if path.suffix == ".safetensors" else torch_bin_problem(path)


def _index_problem(directory: Path, index: Path, weight_map: dict) -> str | None:
    """A tensor the index places in a shard whose header lacks it (a shard from another export), or None."""
    by_shard: dict[str, list[str]] = {}
    for tensor, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(tensor)
    for shard, tensors in sorted(by_shard.items()):
        held = read_header(directory / shard)  # readable: file_problem passed
        absent = [t for t in tensors if t not in held]
        if absent:
            return (f"{index} places {absent[0]!r}" + (f" and {len(absent) - 1} more tensor(s)" if len(absent) > 1
                    else "") + f" in {shard}, which does not hold it: the shards come from different exports; "
                    "copy the whole checkpoint again")
    return None


def model_type_problem(spec: ModelSpec) -> str | None:
    """Why transformers cannot build `spec`'s model_type, or None."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if spec.model_type in CONFIG_MAPPING_NAMES:
        return None
    close = difflib.get_close_matches(spec.model_type, list(CONFIG_MAPPING_NAMES), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    import transformers

    return (f"{spec.name}/config.json has model_type={spec.model_type!r}, which transformers "
            f"{transformers.__version__} does not know: {hint}fix config.json or use a transformers that has it")


def tokenizer_problem(tokenizer: Any, directory: Path, spec: ModelSpec) -> str | None:
    """Why `tokenizer` (loaded from `directory`) cannot drive generation for `spec`, or None."""
    size = len(tokenizer)
    if size < 2:
        return f"{directory}: the tokenizer has {size} token(s): copy the checkpoint's tokenizer files"
    if size > spec.vocab_size:
        return (f"{directory}: the tokenizer has {size} tokens but the model's vocab_size is {spec.vocab_size}: "
                "token ids past the embedding would crash; the tokenizer belongs to another model")
    stops = eos_ids(tokenizer, directory)
    if not stops:
        return (f"{directory}: the tokenizer has no eos token and generation_config.json lists no eos_token_id, "
                "so responses would never end: set eos_token in tokenizer_config.json")
    turn_end = end_of_turn(tokenizer)
    if turn_end is not None and tokenizer.convert_tokens_to_ids(turn_end) not in stops:
        return (f"{directory}: the chat template ends a turn with {turn_end!r} but the eos token is "
                f"{tokenizer.eos_token!r}, so responses would run past the end of the turn: set eos_token to "
                f"{turn_end!r} in tokenizer_config.json, or list its id in generation_config.json's eos_token_id")
    return None
