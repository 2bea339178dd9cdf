"""A model directory checked before anything loads it: config, weights, tokenizer, end of turn.

    problem = weights_problem(directory)          # cheap: file names only (dry runs too)
    tokenizer = checked_tokenizer(directory, spec)  # imports transformers: the real run's preflight

Each problem is one line naming the directory, what is wrong and the fix; the caller prefixes
the config key. Without these, a directory without weights or with an unknown model_type died
inside a Ray actor with 50-80 lines of traceback, and a tokenizer without an eos token generated
past the end of the chat turn.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

from logicrl.models.spec import ModelSpec

INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def weights_problem(directory: Path) -> str | None:
    """Why `directory` holds no loadable weights, or None: safetensors or .bin files, and every
    shard an index lists."""
    for name in INDEX_FILES:
        index = directory / name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (json.JSONDecodeError, KeyError, AttributeError) as err:
                return f"{index} is not a weight index ({type(err).__name__}): re-export the checkpoint"
            missing = [s for s in shards if not (directory / s).is_file()]
            if missing:
                return (f"{directory} lacks {missing[0]}" + (f" and {len(missing) - 1} more shard(s)" if len(missing) > 1
                        else "") + f", listed in {name}: copy the whole checkpoint")
            return None
    if any(p.is_file() for pattern in WEIGHT_PATTERNS for p in directory.glob(pattern)):
        return None
    return (f"{directory} has config.json but no weights (*.safetensors or pytorch_model*.bin): copy the "
            "checkpoint's weight files there")


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


def eos_ids(tokenizer: Any, directory: Path) -> list[int]:
    """The tokens that end a response: the tokenizer's eos, then generation_config.json's
    eos_token_id (an int or a list; chat models list their end-of-turn token there)."""
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    config = directory / "generation_config.json"
    if config.is_file():
        try:
            listed = json.loads(config.read_text()).get("eos_token_id")
        except json.JSONDecodeError:
            listed = None
        for token in [listed] if isinstance(listed, int) else listed or []:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    return ids


def end_of_turn(tokenizer: Any) -> str | None:
    """The token the chat template writes right after an assistant message, or None without a
    template (or when it writes plain text there)."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "\x00logicrl-reply\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "assistant", "content": marker}],
                                         tokenize=False)
    after = text.split(marker, 1)[-1] if marker in text else ""
    ids = tokenizer.encode(after, add_special_tokens=False)
    # Turn markers are added tokens flagged special; all_special_ids lists only the named roles
    # (eos, pad, ...), which is what may be missing.
    special = {i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special}
    if not ids or ids[0] not in special | set(tokenizer.all_special_ids):
        return None
    return tokenizer.convert_ids_to_tokens(ids[0])


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
