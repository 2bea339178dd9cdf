"""actor_rollout_ref.rollout.multi_turn: checked once, before Ray or any model starts.

With tools on, the tools the config names are loaded (a missing file, an unknown class or a bad schema
is the tools package's one-line error), and the model's chat template must render a tool turn as an
append-only suffix (data/tool_turns.py). A TP group generates in lock-step, which rows that take
different numbers of turns cannot keep, so tensor_model_parallel_size must be 1.
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
        named = [f"{KEY}.{k}={mt[k]}" for k in ("tool_config_path", "function_tool_path") if mt[k]]
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

    try:
        ToolTurns(load_tokenizer(cfg[ARR].model.path, quiet=True))
    except ChatTemplateError as err:
        raise ConfigError(f"{KEY}.enable=true, {ARR}.model.path={cfg[ARR].model.path}: {err}") from None


def prompt_tools(cfg: DictConfig) -> list[dict] | None:
    """The OpenAI function schemas of the run's tools, for the chat template to list in the prompt (as verl
    renders its prompts); None with tools off, so single-turn prompts render as they always have."""
    mt = cfg[ARR].rollout.multi_turn
    if not mt.enable:
        return None
    return [tool.schema for tool in load_tools(mt.tool_config_path, mt.function_tool_path).values()]
