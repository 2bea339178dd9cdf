"""Multi-turn rollouts: a RolloutEngine that wraps another and runs the tools the model calls between turns.

    engine = MultiTurnEngine(inner, tokenizer, runner, parse_hermes, limits)
    out = engine.generate(prompts, mask, params, tools_kwargs=per_row)   # one trajectory per row

Each turn the inner engine continues every unfinished row from its ids so far (the prompt, then every
sampled and appended token, never re-tokenized) until its end-of-turn token or the budget. A turn that
ended on that token and wrote tool calls (the first turn's text includes an assistant message the prompt
opened and left for the model to continue) gets them run; the answers are rendered as one tool turn by the
chat template (data/tool_turns.py, its separator and multi_turn.assistant_opening included) and appended as
ids. A row ends when a turn calls nothing, at multi_turn.max_assistant_turns, or when the trajectory reaches
params.max_tokens (data.max_response_length: the budget counts sampled and tool tokens alike; a tool turn that
does not fit is cut, and the masks are cut with it). Sampled tokens, each turn's end-of-turn token included,
have loss mask 1 and their engine log-prob; tool tokens attention 1, loss 0, log-prob 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import torch

from logicrl.data.tool_turns import ToolTurns, truncate_text
from logicrl.tools import ToolResult, ToolRunner, load_tools, parse_hermes
from logicrl.workers.rollout.base import RolloutOutput, SamplingParams

# Per-row statistics a multi-turn engine returns in RolloutOutput.extras ([N] each); trainer/turns.py
# turns them into the tool/ and num_turns/ metrics.
TURN_FIELDS = ("num_turns", "tool_calls", "tool_failures", "tool_latency_s")
# Threads that wait on the runner for the rows of one turn (they only wait: the runner's pool runs the tools).
MAX_ROW_THREADS = 32
# multi_turn.format -> the parser of an assistant turn's text into tool calls.
PARSERS = {"hermes": parse_hermes}


@dataclass(frozen=True)
class TurnLimits:
    """actor_rollout_ref.rollout.multi_turn's limits (verl's keys)."""

    max_assistant_turns: int | None = None  # None: until no call or the budget
    max_parallel_calls: int = 1  # calls run per turn; later ones are answered with an error
    max_tool_response_length: int = 256  # characters of one tool answer the model sees
    tool_response_truncate_side: str = "middle"


class MultiTurnEngine:
    def __init__(self, engine: Any, tokenizer: Any, runner: Any, parse: Callable[[str], list],
                 limits: TurnLimits, assistant_opening: str = ""):
        self.engine, self.tokenizer, self.runner, self.parse, self.limits = engine, tokenizer, runner, parse, limits
        self.turns = ToolTurns(tokenizer, assistant_opening)
        self.pad_id = int(tokenizer.pad_token_id)

    # The inner engine's state and weights are the wrapper's.
    weights_valid = property(lambda self: self.engine.weights_valid)
    micro_batch_size = property(lambda self: self.engine.micro_batch_size)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.sync_weights(named_tensors)

    def sync_adapters(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.engine.sync_adapters(named_tensors)

    def sleep(self) -> None:
        self.engine.sleep()

    def wake(self) -> None:
        self.engine.wake()

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
                 micro_batch_size: int | None = None,
                 tools_kwargs: Sequence[dict] | None = None) -> RolloutOutput:
        """One trajectory per row of the left-padded prompts [N, P]; `tools_kwargs[i]` is row i's
        verl-style extra_info.tools_kwargs (tool name -> kwargs), or None for none."""
        rows, budget = input_ids.shape[0], params.max_tokens
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())]
        kwargs = list(tools_kwargs) if tools_kwargs is not None else [None] * rows
        ids: list[list[int]] = [[] for _ in range(rows)]
        loss: list[list[int]] = [[] for _ in range(rows)]
        logp: list[list[float]] = [[] for _ in range(rows)]
        stats = {name: [0.0] * rows for name in TURN_FIELDS}
        # A prompt may end inside an assistant message it opened; the first turn's text starts there.
        opened = [self.turns.continued(p) for p in prompts]
        active, turn = list(range(rows)), 0
        while active:
            turn += 1
            room = [budget - len(ids[i]) for i in active]
            context, mask = left_pad([prompts[i] + ids[i] for i in active], self.pad_id)
            # Each turn draws its own stream; rows keep theirs by position, as in a single-turn call.
            seed = None if params.seed is None else (params.seed * 1_000_033 + turn) % 2**62
            out = self.engine.generate(context, mask, replace(params, max_tokens=max(room), seed=seed),
                                       micro_batch_size=micro_batch_size)
            ends = out.response_lengths.tolist()
            pending = []
            for j, i in enumerate(active):
                n = min(ends[j], room[j])  # a row with less room than the longest is cut to its own
                new = out.responses[j, :n].tolist()
                ids[i] += new
                loss[i] += out.response_mask[j, :n].long().tolist()
                logp[i] += out.log_probs[j, :n].float().tolist()
                stats["num_turns"][i] += 1
                # Only a turn closed by the end-of-turn token can be answered: a turn cut by the budget has
                # no room left, and another stop token (the tokenizer's eos) ends the conversation.
                closed = n > 0 and new[-1] == self.turns.end_of_turn_id and len(ids[i]) < budget
                limit = self.limits.max_assistant_turns
                if not closed or (limit is not None and stats["num_turns"][i] >= limit):
                    continue
                # A turn's text starts where its assistant message does: the prompt's opening, or the assistant
                # opening a tool turn ended with.
                written = self.tokenizer.decode(opened[i] + new if turn == 1 else new, skip_special_tokens=True)
                calls = self.parse(written if turn == 1 else self.turns.assistant_opening + written)
                if calls:
                    pending.append((i, calls))
            active = []
            # The rows' calls go to the runner together; its own pool bounds how many run at once.
            with ThreadPoolExecutor(max_workers=max(1, min(len(pending), MAX_ROW_THREADS))) as pool:
                answers = list(pool.map(lambda item: self._answer(item[1], kwargs[item[0]]), pending))
            for (i, calls), (turn_ids, results) in zip(pending, answers, strict=True):
                stats["tool_calls"][i] += len(calls)
                stats["tool_failures"][i] += sum(not r.ok for r in results)
                stats["tool_latency_s"][i] += sum(r.latency_s for r in results)
                tool_ids = turn_ids[:budget - len(ids[i])]
                ids[i] += tool_ids
                loss[i] += [0] * len(tool_ids)
                logp[i] += [0.0] * len(tool_ids)
                if len(ids[i]) < budget:
                    active.append(i)
        return self._output(ids, loss, logp, budget, stats)

    def _answer(self, calls: list, tools_kwargs: dict | None) -> tuple[list[int], list[ToolResult]]:
        """Run a turn's calls (the first max_parallel_calls; verl drops the others unanswered, here each gets
        an error the model reads) and render their answers as one tool turn."""
        run = calls[:self.limits.max_parallel_calls]
        results = list(self.runner.run(run, tools_kwargs or {}))
        results += [ToolResult.failure("too_many_calls", f"only {self.limits.max_parallel_calls} tool call(s) run "
                                       "per turn; this one was not") for _ in calls[len(run):]]
        limits = self.limits
        messages = [{"role": "tool", "name": call.name or "unknown",
                     "content": truncate_text(result.text, limits.max_tool_response_length,
                                              limits.tool_response_truncate_side)}
                    for call, result in zip(calls, results, strict=True)]
        return self.turns.ids(messages), results

    def _output(self, ids, loss, logp, budget: int, stats: dict) -> RolloutOutput:
        rows = len(ids)
        responses = torch.full((rows, budget), self.pad_id, dtype=torch.long)  # [N, R]
        attended = torch.zeros((rows, budget), dtype=torch.long)
        trained = torch.zeros((rows, budget), dtype=torch.long)
        log_probs = torch.zeros((rows, budget), dtype=torch.float32)
        for i in range(rows):
            n = len(ids[i])
            responses[i, :n] = torch.tensor(ids[i], dtype=torch.long)
            attended[i, :n] = 1
            trained[i, :n] = torch.tensor(loss[i], dtype=torch.long)
            log_probs[i, :n] = torch.tensor(logp[i], dtype=torch.float32)
        extras = {name: torch.tensor(values, dtype=torch.float32) for name, values in stats.items()}
        return RolloutOutput(responses=responses, response_attention_mask=attended, response_mask=trained,
                             log_probs=log_probs, extras=extras)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists as left-padded input_ids and attention_mask [len(rows), longest]."""
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return input_ids, mask


def limits_of(multi_turn: Any) -> TurnLimits:
    """TurnLimits from the config's actor_rollout_ref.rollout.multi_turn group."""
    return TurnLimits(max_assistant_turns=multi_turn.max_assistant_turns,
                      max_parallel_calls=multi_turn.max_parallel_calls,
                      max_tool_response_length=multi_turn.max_tool_response_length,
                      tool_response_truncate_side=multi_turn.tool_response_truncate_side)


def with_tools(cfg: Any, engine: Any, tokenizer: Any) -> MultiTurnEngine:
    """The rank's engine wrapped in the tool loop, with the tools multi_turn's paths name (the config was
    checked before any worker started, so loading them again here cannot fail on the config)."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    tools = load_tools(mt.tool_config_path, mt.function_tool_path)
    runner = ToolRunner(tools, max_parallel_calls=mt.max_parallel_calls)
    return MultiTurnEngine(engine, tokenizer, runner, PARSERS[mt.format], limits_of(mt), mt.assistant_opening)


def row_tools_kwargs(extra_info: Sequence[Any]) -> list[dict]:
    """Each row's extra_info.tools_kwargs (verl's per-row tool arguments: tool name -> kwargs), {} where absent."""
    return [dict((extra or {}).get("tools_kwargs") or {}) if isinstance(extra, dict) or extra is None else {}
            for extra in extra_info]
