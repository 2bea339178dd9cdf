"""The phases of one training step: one row each, read by the step plan, the memory planner, auto
micro-batching, the workers, the metrics and the docs.

A phase's row says which model it runs and how it splits a rank's rows: its micro-batch key (rows per
pass) and, where it can pack by tokens instead (`use_dynamic_bsz`), its token budget key and the switch.
Adding a phase is adding a row here, a footprint in memory/phases.py and a method on the worker.
"""

from __future__ import annotations

from dataclasses import dataclass

ARR = "actor_rollout_ref"


@dataclass(frozen=True)
class Phase:
    name: str  # the one spelling: timing_s/<name>, perf/memory/<name>/..., the plan's rows
    # The model whose weights the phase runs: "actor", "ref", "critic", "reward_model" (FSDP2 models),
    # "engine" (the rollout engine's own copy), or None for a phase on the controller (no memory to plan).
    model: str | None
    forward_only: bool = False  # an FSDP2 forward without a backward (FSDP2 leaves its root unit gathered)
    rows_key: str | None = None  # rows per pass on one rank; None: the phase does not split its rows
    budget_key: str | None = None  # tokens per pass with use_dynamic_bsz; None: it splits by rows only
    dynamic_key: str | None = None  # the use_dynamic_bsz switch between the two
    updates: bool = False  # a backward and optimizer steps on its model: ppo_epochs over the mini-batches

    @property
    def on_worker(self) -> bool:
        return self.model is not None

    @property
    def budgeted(self) -> bool:
        return self.budget_key is not None


# In step order; keys written out whole, so a grep for a key finds its phase. reward_model comes before
# reward: the reward step combines its learned score with the rule reward. values splits by the critic's
# training micro-batch (verl has no key of its own for it).
STEP = (
    Phase("generate", "engine", rows_key="actor_rollout_ref.rollout.max_num_seqs"),
    Phase("reward_model", "reward_model", forward_only=True,
          rows_key="reward_model.micro_batch_size_per_gpu",
          budget_key="reward_model.forward_max_token_len_per_gpu",
          dynamic_key="reward_model.use_dynamic_bsz"),
    Phase("reward", None),
    Phase("old_log_prob", "actor", forward_only=True,
          rows_key="actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
          budget_key="actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
          dynamic_key="actor_rollout_ref.rollout.log_prob_use_dynamic_bsz"),
    Phase("ref", "ref", forward_only=True,
          rows_key="actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
          budget_key="actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
          dynamic_key="actor_rollout_ref.ref.log_prob_use_dynamic_bsz"),
    Phase("values", "critic", forward_only=True, rows_key="critic.ppo_micro_batch_size_per_gpu"),
    Phase("advantages", None),
    Phase("update_critic", "critic",
          rows_key="critic.ppo_micro_batch_size_per_gpu",
          budget_key="critic.ppo_max_token_len_per_gpu",
          dynamic_key="critic.use_dynamic_bsz", updates=True),
    Phase("update_actor", "actor",
          rows_key="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
          budget_key="actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
          dynamic_key="actor_rollout_ref.actor.use_dynamic_bsz", updates=True),
    # The actor's weights gathered in buckets and loaded into the engine.
    Phase("update_weights", "actor"),
)

BY_NAME = {p.name: p for p in STEP}
PHASES = tuple(p.name for p in STEP)
# The phases that run on the workers: the ones with a memory footprint to plan and measure.
WORKER_PHASES = tuple(p.name for p in STEP if p.on_worker)
BUDGETED_PHASES = tuple(p.name for p in STEP if p.budgeted)
# The forward passes over a scored batch before its advantages (the step loop runs those the plan keeps).
SCORING_PASSES = PHASES[PHASES.index("reward") + 1:PHASES.index("advantages")]
UPDATE_PHASES = tuple(p.name for p in STEP if p.updates)


def phase(name: str) -> Phase:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no phase {name!r}; the phases are {', '.join(PHASES)}") from None


def token_key(key: str) -> str:
    """The token budget key of the phase a micro-batch key belongs to (a budget key maps to itself):
    actor.ppo_micro_batch_size_per_gpu -> actor.ppo_max_token_len_per_gpu. A key of no budgeted phase
    is returned as it is."""
    for p in STEP:
        if p.budgeted and key in (p.rows_key, p.budget_key):
            return p.budget_key
    return key
