"""The tokens that end a response: the tokenizer's eos, generation_config.json's eos_token_id, and
the token a chat template writes after an assistant message.

    stops = eos_ids(tokenizer, directory)   # the rollout engines stop at these
    turn_end = end_of_turn(tokenizer)       # the preflight checks it is among them
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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
