"""The phases of one training step: one row each, read by the step plan, the memory planner, auto
micro-batching, the workers, the metrics and the docs.

A phase's row says which model it runs (a row of config/models.py, or the engine), whether it is a
forward or a training update, and how it splits a rank's rows: its micro-batch key (rows per pass) and,
where it can pack by tokens instead (`use_dynamic_bsz`), its token budget key and the switch. Every list
of phases (the planner's, auto micro-batching's, the step telemetry's) is derived below from these rows.
Adding a phase is adding a row here, a method on the worker and, unless it is a forward or an update of
a model (planned from its row), a footprint in memory/phases.py (FOOTPRINTS).
"""

from __future__ import annotations

from dataclasses import dataclass

from logicrl.config.models import MODELS
from logicrl.config.models import model as model_row

ARR = "actor_rollout_ref"


@dataclass(frozen=True)
class Phase:
    name: str  # the one spelling: timing_s/<name>, perf/memory/<name>/..., the plan's rows
    # The model whose weights the phase runs: "actor", "ref", "critic", "reward_model" (FSDP2 models),
    # "engine" (the rollout engine's own copy), or None for a phase on the controller (no memory to plan).
    model: str | None
    forward_only: bool = False  # an FSDP2 forward without a backward (FSDP2 leaves its root unit gathered)
    backward: bool = False  # a training update: forward and backward over the model's mini-batches
    rows_key: str | None = None  # rows per pass on one rank; None: the phase does not split its rows
    budget_key: str | None = None  # tokens per pass with use_dynamic_bsz; None: it splits by rows only
    dynamic_key: str | None = None  # the use_dynamic_bsz switch between the two

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
    Phase("update_critic", "critic", backward=True,
          rows_key="critic.ppo_micro_batch_size_per_gpu",
          budget_key="critic.ppo_max_token_len_per_gpu",
          dynamic_key="critic.use_dynamic_bsz"),
    Phase("update_actor", "actor", backward=True,
          rows_key="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
          budget_key="actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
          dynamic_key="actor_rollout_ref.actor.use_dynamic_bsz"),
    # The actor's weights gathered in buckets and loaded into the engine.
    Phase("update_weights", "actor"),
)

BY_NAME = {p.name: p for p in STEP}
PHASES = tuple(p.name for p in STEP)
# The phases that run on the workers: the ones with a memory footprint to plan and measure.
WORKER_PHASES = tuple(p.name for p in STEP if p.on_worker)
BUDGETED_PHASES = tuple(p.name for p in STEP if p.budgeted)
# The training updates, and the trained model each updates.
UPDATE_PHASES = tuple(p.name for p in STEP if p.backward)
UPDATE_OF = {p.model: p.name for p in STEP if p.backward}
# Forward-only passes over the trainer's rows, the policy's tokens (the step telemetry's tokens/s): not a
# model that may read them in its own tokenization (the reward model's input_tokenizer).
FORWARD_PHASES = tuple(p.name for p in STEP if p.forward_only and not model_row(p.model).own_tokens)
# The models that run the policy's weights: the engine's copy and the roles loaded from the actor's path.
POLICY_MODELS = ("engine", *(m.name for m in MODELS if m.path_key == model_row("actor").path_key))
# The phases whose split auto micro-batching sizes (memory/fit.py), in the order it tries them and lists
# its picks: the policy's passes first, then the other models', each in step order.
SIZED_PHASES = tuple(p.name for p in sorted((p for p in STEP if p.rows_key),
                                             key=lambda p: p.model not in POLICY_MODELS))


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
