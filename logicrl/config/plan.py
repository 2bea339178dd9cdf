"""The step plan: every number a training step derives from the config, worked out once.

    plan = build_plan(cfg, train_rows)    # cfg typed, migrated and normalised (config/validate.py)

verl's batch meanings: data.train_batch_size prompts per step (global), rollout.n responses per
prompt, *.ppo_mini_batch_size prompts per optimizer step (global), *_micro_batch_size_per_gpu
responses per pass on one rank, *_max_token_len_per_gpu a pass's token budget with use_dynamic_bsz.

This module is the only reader of those keys (config/phases.py names, per phase, which ones). The
dry-run summary, the memory planner, the trainer and the workers read the plan: prompts, responses,
ranks, steps (`count_steps`), which phases run and why the others are skipped, and each phase's
split with the key that sets it. `with_micro` gives a new plan with other values (auto_micro_batch's
picks; OOM-halved values are per-rank state).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from omegaconf import DictConfig, OmegaConf

from logicrl.config.async_training import rollout_ranks, staleness
from logicrl.config.errors import ConfigError
from logicrl.config.models import TRAINED, in_use, model
from logicrl.config.phases import ARR, BY_NAME, PHASES, STEP, UPDATE_OF, WORKER_PHASES, Phase, token_key

__all__ = ["ARR", "PHASES", "WORKER_PHASES", "Micro", "Update", "PhasePlan", "StepPlan", "build_plan", "count_steps",
           "swap_micro", "token_key"]


@dataclass(frozen=True)
class Micro:
    """How a phase splits a rank's rows: `value` rows per pass, or about `value` tokens (by_tokens)."""

    key: str  # the config key that sets it, for messages and suggestions
    value: int
    by_tokens: bool = False

    def describe(self) -> str:
        return f"<= {self.value} tokens" if self.by_tokens else f"{self.value} rows"


@dataclass(frozen=True)
class Update:
    """One trained role (actor or critic): its mini- and micro-batches on one rank."""

    mini_prompts: int  # prompts per optimizer step (global)
    per_rank_mini: int  # responses per optimizer step on one rank
    micro: Micro  # rows per forward/backward, or a token budget
    ppo_epochs: int
    num_mini: int  # mini-batches per step
    # fsdp_config.grad_accumulation: "sharded", "unsharded", or "auto" until the preflight's memory
    # plan picks one (memory/planner.py resolve_grad_accumulation); a worker reads "auto" as unsharded.
    grad_accumulation: str = "auto"

    @property
    def sharded_grads(self) -> bool:
        return self.grad_accumulation == "sharded"

    @property
    def grad_accum(self) -> int | None:
        """Micro-batches per mini-batch; None when packed by tokens (it varies)."""
        return None if self.micro.by_tokens else self.per_rank_mini // self.micro.value

    @property
    def optimizer_steps(self) -> int:
        return self.num_mini * self.ppo_epochs


@dataclass(frozen=True)
class PhasePlan:
    name: str
    skipped: str | None  # why the phase does not run; None when it runs
    micro: Micro | None  # None for phases that do not split their rows

    @property
    def runs(self) -> bool:
        return self.skipped is None


@dataclass(frozen=True)
class StepPlan:
    prompts: int  # per step, global
    n: int  # responses per prompt
    ranks: int
    train_rows: int  # usable training prompts (rows in the files until the trainer has filtered them)
    total_epochs: int
    max_steps: int | None  # trainer.total_training_steps; None: every epoch runs
    actor: Update
    critic: Update | None  # only with a critic (gae)
    phases: tuple[PhasePlan, ...]  # in PHASES order
    # Dynamic sampling (algorithm.filter_groups): prompts per generation round (data.gen_batch_size) and the
    # rounds a step may take (None: no limit). Without it one round of `prompts` per step.
    filter_groups: bool = False
    gen_prompts: int = 0  # 0: `prompts` (plans built by hand in tests)
    max_gen_rounds: int | None = 1
    # A dry run's refusals that a launch gives at validation (config/quantization.py): said after its plan.
    launch_refusals: tuple[str, ...] = ()
    # trainer.val_only: nothing trains, so the training files need not fill a batch (an evaluation set of 4).
    val_only: bool = False
    # Ranks of a rollout group of their own (actor_rollout_ref.hybrid_engine=false); 0: every rank generates.
    rollout_ranks: int = 0

    @property
    def responses(self) -> int:
        return self.prompts * self.n

    # The ranks that generate and the ranks that train: the same ranks while every rank holds the engine
    # and the trained models (the colocated worker); two groups once rollout and training are placed apart.
    @property
    def generating_ranks(self) -> int:
        return self.rollout_ranks or self.ranks

    @property
    def training_ranks(self) -> int:
        return self.ranks

    @property
    def round_prompts(self) -> int:
        """Prompts per generation round."""
        return self.gen_prompts or self.prompts

    @property
    def gen_per_rank_responses(self) -> int:
        """Responses one rank generates per round: what the generate phase holds at once."""
        return self.round_prompts * self.n // self.generating_ranks

    @property
    def per_rank_responses(self) -> int:
        return self.responses // self.ranks

    @property
    def steps_per_epoch(self) -> int:
        return count_steps(self.train_rows, self.prompts, self.total_epochs, self.max_steps)[0]

    @property
    def total_steps(self) -> int:
        return count_steps(self.train_rows, self.prompts, self.total_epochs, self.max_steps)[1]

    def update(self, role: str) -> Update | None:
        """A trained role's mini- and micro-batches; None for a role that does not train (or no critic)."""
        return getattr(self, role) if role in TRAINED else None

    def phase(self, name: str) -> PhasePlan:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"no phase {name!r}; the phases are {', '.join(PHASES)}")

    def runs(self, name: str) -> bool:
        return self.phase(name).runs

    def micro(self, name: str) -> Micro:
        micro = self.phase(name).micro
        if micro is None:
            raise KeyError(f"phase {name!r} has no micro-batch")
        return micro

    def forwards(self, name: str) -> int:
        """Forward-only passes per rank of a fixed-size phase; the last may be smaller."""
        return math.ceil(self.per_rank_responses / self.micro(name).value)

    def for_rows(self, train_rows: int) -> StepPlan:
        """The same plan over `train_rows` usable prompts (after truncation=filter / skip_bad_rows)."""
        if self.val_only:
            return replace(self, train_rows=train_rows)
        if train_rows < self.prompts:
            raise ConfigError(f"data.train_files hold {train_rows} usable prompts, fewer than data.train_batch_size="
                              f"{self.prompts}: no step could run; lower the batch or add data")
        if train_rows < self.round_prompts:
            raise ConfigError(f"data.train_files hold {train_rows} usable prompts, fewer than data.gen_batch_size="
                              f"{self.round_prompts}: no generation round could run; lower it or add data")
        return replace(self, train_rows=train_rows)

    def with_micro(self, values: dict[str, int]) -> StepPlan:
        """A new plan with the micro-batches or token budgets set by config key in `values` changed
        (swap_micro); the trained roles' micro-batches must still divide their mini-batches."""
        phases = swap_micro(self.phases, values)
        updates = {role: replace(u, micro=_micro_in(phases, UPDATE_OF[role]))
                   for role in TRAINED if (u := self.update(role)) is not None}
        for role, u in updates.items():
            _check_divides(u, model(role).prefix)
        return replace(self, phases=phases, **updates)

    def with_grad_accumulation(self, modes: dict[str, str]) -> StepPlan:
        """A new plan with each trained role's grad_accumulation set, by role (the preflight's resolution
        of "auto"); a role this plan does not train is ignored."""
        return replace(self, **{role: replace(u, grad_accumulation=modes[role])
                                for role in TRAINED if (u := self.update(role)) is not None})


def count_steps(train_rows: int, prompts: int, total_epochs: int, max_steps: int | None) -> tuple[int, int]:
    """(steps per epoch, steps in all). The last incomplete batch of an epoch is dropped, as verl does:
    every step sees the same batch size. trainer.total_training_steps caps the run, it never adds epochs."""
    per_epoch = train_rows // prompts
    every_epoch = per_epoch * total_epochs
    return per_epoch, min(every_epoch, max_steps) if max_steps else every_epoch


def swap_micro(phases: tuple[PhasePlan, ...], values: dict[str, int]) -> tuple[PhasePlan, ...]:
    """`phases` with the micro-batches or token budgets set by config key in `values` changed.

    A budgeted phase split by rows may be given its token budget key instead (its row in
    config/phases.py): it then splits by tokens, as with use_dynamic_bsz=true (auto_micro_batch prefers
    budgets for packed sequences). A key shared by two phases (the critic's micro-batch sizes values and
    update_critic) changes both."""
    known = {p.micro.key for p in phases if p.micro is not None}
    known |= {BY_NAME[p.name].budget_key for p in phases if p.micro is not None and BY_NAME[p.name].budgeted}
    unknown = set(values) - known
    if unknown:
        raise KeyError(f"not a micro-batch key of this plan: {sorted(unknown)}")

    def swap(p: PhasePlan) -> PhasePlan:
        micro, row = p.micro, BY_NAME[p.name]
        if micro is None:
            return p
        if micro.key in values:
            return replace(p, micro=replace(micro, value=values[micro.key]))
        if row.budgeted and not micro.by_tokens and row.budget_key in values:
            return replace(p, micro=Micro(row.budget_key, int(values[row.budget_key]), by_tokens=True))
        return p

    return tuple(swap(p) for p in phases)


def _micro_in(phases: tuple[PhasePlan, ...], name: str) -> Micro:
    return next(p.micro for p in phases if p.name == name)


def micro_of(cfg: DictConfig, phase: Phase) -> Micro | None:
    """How `phase` splits a rank's rows under `cfg`: its micro-batch, or its token budget when its
    use_dynamic_bsz switch is on; None for a phase that does not split."""
    if phase.rows_key is None:
        return None
    by_tokens = phase.dynamic_key is not None and bool(OmegaConf.select(cfg, phase.dynamic_key))
    key = phase.budget_key if by_tokens else phase.rows_key
    return Micro(key, int(OmegaConf.select(cfg, key)), by_tokens)


def _update(cfg: DictConfig, phase: str, prefix: str, prompts: int, n: int, ranks: int) -> Update:
    role = OmegaConf.select(cfg, prefix)
    mini = role.ppo_mini_batch_size
    if prompts % mini:
        raise ConfigError(f"{prefix}.ppo_mini_batch_size={mini} must divide data.train_batch_size={prompts}")
    if (mini * n) % ranks:
        raise ConfigError(
            f"{prefix}.ppo_mini_batch_size={mini} x {ARR}.rollout.n={n} = {mini * n} responses per mini-batch "
            f"do not split across trainer.n_gpus={ranks} ranks: make the product a multiple of {ranks}")
    update = Update(mini_prompts=mini, per_rank_mini=mini * n // ranks, ppo_epochs=role.ppo_epochs,
                    num_mini=prompts // mini, grad_accumulation=role.fsdp_config.grad_accumulation,
                    micro=micro_of(cfg, BY_NAME[phase]))
    _check_divides(update, prefix)
    return update


def _check_divides(u: Update, prefix: str) -> None:
    if not u.micro.by_tokens and u.per_rank_mini % u.micro.value:
        raise ConfigError(
            f"{u.micro.key}={u.micro.value} must divide the per-rank mini-batch of {u.per_rank_mini} responses "
            f"({prefix}.ppo_mini_batch_size={u.mini_prompts} x rollout.n / trainer.n_gpus): use a divisor of "
            f"{u.per_rank_mini}, or {prefix}.use_dynamic_bsz=true")


def build_plan(cfg: DictConfig, train_rows: int) -> StepPlan:
    """Check the batch arithmetic of a normalised config and plan its steps; raises ConfigError."""
    algo = cfg.algorithm
    prompts, n, ranks = cfg.data.train_batch_size, cfg[ARR].rollout.n, cfg.trainer.n_gpus
    if (prompts * n) % ranks:
        raise ConfigError(
            f"data.train_batch_size={prompts} x {ARR}.rollout.n={n} = {prompts * n} responses do not split "
            f"across trainer.n_gpus={ranks} ranks: make the product a multiple of {ranks}")
    fg = algo.filter_groups
    gen_prompts, max_rounds = prompts, 1
    if fg.enable:
        gen_prompts = cfg.data.gen_batch_size or prompts
        max_rounds = fg.max_num_gen_batches if fg.max_num_gen_batches > 0 else None
        # A round is generated by the generating ranks: every rank colocated, the rollout group's on two groups.
        generating = rollout_ranks(cfg)
        gen_ranks = generating or ranks
        where = "rollout.nnodes x rollout.n_gpus_per_node" if generating else "trainer.n_gpus"
        if (gen_prompts * n) % gen_ranks:
            raise ConfigError(
                f"data.gen_batch_size={gen_prompts} x {ARR}.rollout.n={n} = {gen_prompts * n} responses a round do not "
                f"split across {where}={gen_ranks} ranks: make the product a multiple of {gen_ranks}")
    used = in_use(cfg)
    updates = {role: _update(cfg, UPDATE_OF[role], model(role).prefix, prompts, n, ranks)
               for role in TRAINED if used[role]}
    actor, critic = updates["actor"], updates.get("critic")

    no_critic = None if critic else f"no critic (algorithm.adv_estimator={algo.adv_estimator})"
    # The old-log-prob pass is skipped when each step makes exactly one optimizer step and no reward
    # term needs it: the policy that sampled is then the policy being updated, the ratio exactly 1.
    on_policy = actor.optimizer_steps == 1 and not algo.use_kl_in_reward
    old_skip = ("on-policy: one optimizer step per step and no KL in the reward, so the sampling policy's "
                "log-probs are the update's own") if on_policy else None
    if on_policy and staleness(cfg):  # the engine sampled with weights an update older than the trainer's
        old_skip = ("one optimizer step per step and no KL in the reward: the trainer's log-probs at the update's "
                    "start are pi_old, its own forward (the engine's, an update older, weight them)")
    if algo.rollout_correction.bypass_mode:  # verl's bypass: pi_old := pi_rollout (algos/rollout_correction.py)
        old_skip = "rollout_correction.bypass_mode: the engine's log-probs are the old log-probs"
    ref_skip = None if used["ref"] else "no KL term (actor.use_kl_loss and algorithm.use_kl_in_reward are off)"
    # The trained roles' micro-batches are their Update's (checked to divide the mini-batch).
    micro = {p.name: micro_of(cfg, p) for p in STEP}
    micro.update(update_actor=actor.micro, update_critic=critic.micro if critic else None)
    rm_skip = None if used["reward_model"] else "no reward model (reward_model.enable=false): rules score"
    skipped = {"reward_model": rm_skip, "old_log_prob": old_skip, "ref": ref_skip, "values": no_critic,
               "update_critic": no_critic}
    phases = tuple(PhasePlan(name, skipped.get(name), micro[name]) for name in PHASES)
    plan = StepPlan(prompts=prompts, n=n, ranks=ranks, train_rows=train_rows, total_epochs=cfg.trainer.total_epochs,
                    max_steps=cfg.trainer.total_training_steps, actor=actor, critic=critic, phases=phases,
                    filter_groups=fg.enable, gen_prompts=gen_prompts, max_gen_rounds=max_rounds,
                    val_only=bool(cfg.trainer.val_only), rollout_ranks=rollout_ranks(cfg))
    return plan.for_rows(train_rows)
