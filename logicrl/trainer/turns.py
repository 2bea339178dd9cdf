"""What the controller reports of multi-turn rollouts: the tool and turn metrics, and the two warnings.

Metrics, from the per-row counts the multi-turn engine adds to the batch (workers/rollout/multi_turn.py):
`tool/calls_per_sample`, `tool/failure_rate` (failed calls over calls), `tool/latency_s` (mean per call),
`num_turns/mean` and `/max` (assistant turns), `tool/token_share` (the share of response tokens that are tool
output: attended, not trained) and `trajectory_length/mean` and `/max` (sampled and tool tokens: what the
budget and memory count; response_length/* count sampled tokens alone, trainer/ppo.py).

The warnings are one line each, once: tools on but no call written in the first steps (a model that was
never shown how to call, or a format it does not speak), and the data's rows and the config disagreeing
(rows with verl's extra_info.tools_kwargs and tools off, which verl users know as a silent single-turn run;
tools on and no row with kwargs for them).
"""

from __future__ import annotations

import logging

from tensordict import TensorDict

from logicrl.algos.masked import response_lengths

log = logging.getLogger("logicrl.trainer")

# Steps without a single tool call after which a run with tools on says so.
SILENT_STEPS = 3


def turn_metrics(batch: TensorDict) -> dict[str, float]:
    """The step's tool and turn metrics; {} for a single-turn batch."""
    if "num_turns" not in batch.keys():
        return {}
    turns, calls = batch["num_turns"].float(), batch["tool_calls"].float()
    total = float(calls.sum())
    attended = batch["response_attention_mask"].float().sum(-1)  # [N]
    trained = batch["response_mask"].float().sum(-1)  # [N]
    return {
        "tool/calls_per_sample": float(calls.mean()),
        "tool/failure_rate": float(batch["tool_failures"].float().sum()) / total if total else 0.0,
        "tool/latency_s": float(batch["tool_latency_s"].float().sum()) / total if total else 0.0,
        "num_turns/mean": float(turns.mean()),
        "num_turns/max": float(turns.max()),
        "tool/token_share": float((attended - trained).sum() / attended.sum().clamp(min=1)),
        "trajectory_length/mean": float(attended.mean()),
        "trajectory_length/max": float(attended.max()),
    }


class ToolWatch:
    """Warns once when a run with tools on has called none in its first SILENT_STEPS steps."""

    def __init__(self, enabled: bool):
        self.enabled, self.silent, self.warned = enabled, 0, False

    def observe(self, step: int, metrics: dict) -> None:
        if not self.enabled or self.warned or "tool/calls_per_sample" not in metrics:
            return
        self.silent = 0 if metrics["tool/calls_per_sample"] > 0 else self.silent + 1
        if self.silent >= SILENT_STEPS:
            self.warned = True
            log.warning(f"actor_rollout_ref.rollout.multi_turn.enable=true, but no response called a tool in "
                        f"{self.silent} steps (up to step {step}): does the prompt show the model the tools and the "
                        "hermes <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> format?")


def tools_kwargs_rows(rows) -> int:
    """Rows whose extra_info holds verl's per-row tool arguments (tools_kwargs)."""
    return sum(1 for row in rows if isinstance(row.extra_info, dict) and row.extra_info.get("tools_kwargs"))


def data_warning(enabled: bool, rows, files) -> str | None:
    """One line when the training rows and multi_turn.enable disagree, else None."""
    with_kwargs = tools_kwargs_rows(rows)
    if not enabled and with_kwargs:
        return (f"{with_kwargs} of {len(rows)} rows of data.train_files={files} carry extra_info.tools_kwargs (tool "
                "arguments), but actor_rollout_ref.rollout.multi_turn.enable=false: every response is one turn, "
                "no tool runs; set it true to use them")
    if enabled and not with_kwargs:
        return (f"actor_rollout_ref.rollout.multi_turn.enable=true and no row of data.train_files={files} has "
                "extra_info.tools_kwargs: every row gets every tool, with no per-row arguments")
    return None


def conversations(batch: TensorDict, tokenizer) -> list[str] | None:
    """Each multi-turn response as the model read it, turn markers and tool answers included (the
    validation samples); None for single-turn batches."""
    if "num_turns" not in batch.keys():
        return None
    lengths = response_lengths(batch["response_attention_mask"]).tolist()
    return [tokenizer.decode(row[:n].tolist(), skip_special_tokens=False)
            for row, n in zip(batch["responses"], lengths)]
