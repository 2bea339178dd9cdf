"""actor_rollout_ref.rollout.multi_turn: checked once, before Ray or any model starts.

With tools on, the tools the config names are loaded (a missing file, an unknown class or a bad schema
is the tools package's one-line error), and the model's chat template must render a tool turn as an
append-only suffix (data/tool_turns.py); an assistant opening must be plain text. A TP group generates in
lock-step, which rows that take different numbers of turns cannot keep, so tensor_model_parallel_size must be 1.
"""

from __future__ import annotations

from omegaconf import DictConfig

from logicrl.config.errors import ConfigError, log
from logicrl.config.phases import ARR
from logicrl.data.tool_turns import ChatTemplateError, ToolTurns
from logicrl.tools import load_tools

KEY = f"{ARR}.rollout.multi_turn"


def check_multi_turn(cfg: DictConfig) -> None:
    rollout = cfg[ARR].rollout
    mt = rollout.multi_turn
    if not mt.enable:
        named = [f"{KEY}.{k}={mt[k]!r}" for k in ("tool_config_path", "function_tool_path", "assistant_opening")
                 if mt[k]]
        if named:
            log.warning(f"{named[0]} takes effect only with {KEY}.enable=true: this run generates one turn per "
                        "prompt and calls no tool")
        return
    if rollout.tensor_model_parallel_size > 1:
        raise ConfigError(f"{KEY}.enable=true with {ARR}.rollout.tensor_model_parallel_size="
                          f"{rollout.tensor_model_parallel_size}: a TP group generates in lock-step and its rows take "
                          "different numbers of turns; set tensor_model_parallel_size=1")
    load_tools(mt.tool_config_path, mt.function_tool_path)  # raises its own one-line ToolConfigError
    from logicrl.models.loading import load_tokenizer  # torch: a config check with tools off imports none

    tokenizer = load_tokenizer(cfg[ARR].model.path, quiet=True)
    try:
        ToolTurns(tokenizer)
    except ChatTemplateError as err:
        raise ConfigError(f"{KEY}.enable=true, {ARR}.model.path={cfg[ARR].model.path}: {err}") from None
    check_assistant_opening(mt.assistant_opening, tokenizer)


def check_assistant_opening(opening: str, tokenizer) -> None:
    """The opening is text the model reads as the start of its own message: a special token in it (an end of
    turn, a role marker) would close or restart the message it opens."""
    special = set(tokenizer.all_special_ids)
    found = [tokenizer.convert_ids_to_tokens(i) for i in tokenizer.encode(opening, add_special_tokens=False)
             if i in special]
    if found:
        raise ConfigError(f"{KEY}.assistant_opening={opening!r} contains the special token {found[0]}: it opens an "
                          "assistant message and must be plain text (the chat template writes the turn markers)")


def prompt_tools(cfg: DictConfig) -> list[dict] | None:
    """The OpenAI function schemas of the run's tools, for the chat template to list in the prompt (as verl
    renders its prompts); None with tools off, so single-turn prompts render as they always have."""
    mt = cfg[ARR].rollout.multi_turn
    if not mt.enable:
        return None
    return [tool.schema for tool in load_tools(mt.tool_config_path, mt.function_tool_path).values()]
