"""The single controller's step loop.

    generate -> reward_model -> reward -> old_log_prob -> ref -> values -> advantages -> update_critic -> update_actor
    -> update_weights -> metrics / validation

One TensorDict carries the step (trainer/batch.py); trainer/dispatch.py sends each rank its shard, the
workers' phase wrapper (workers/phase_worker.py `run`) times it and measures its memory
(`perf/memory/<phase>/peak_gb`), and what the ranks computed is added to the batch. What a step gathers
as it runs is its own StepState (trainer/step_state.py), not the trainer's. Which phases run, how
many steps there are and every batch size come from the step plan (config/plan.py).
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict

from logicrl.algos import advantage_metrics, apply_kl_penalty, compute_advantage, make_kl_controller
from logicrl.checkpoint_layout import step_of
from logicrl.config.eval_keys import eval_sampling
from logicrl.config.multi_turn import prompt_tools
from logicrl.config.phases import SCORING_PASSES, UPDATE_PHASES
from logicrl.config.phases import phase as phase_row
from logicrl.config.plan import ARR, StepPlan
from logicrl.config.rewards import combine_rule, reward_check
from logicrl.data.dataset import load_prompts
from logicrl.errors import BadInput
from logicrl.eval.report import flat_metrics, group_metrics
from logicrl.faults import Faults
from logicrl.logs import quiet_driver
from logicrl.models.eos import eos_ids
from logicrl.models.loading import checkpoint_dir, load_tokenizer
from logicrl.models.spec import load_model_spec
from logicrl.preflight.checkpoints import way_out, write_run_shape
from logicrl.reward.pool import make_scorer
from logicrl.rng import capture_rng_state, restore_rng_state
from logicrl.signals import Preempted, requested, stop_at_step_end
from logicrl.trainer.batch import balanced_order, cat_rounds, merge_rank_metrics, prompt_batch, shape_metrics
from logicrl.trainer.checkpoint import (
    TrainerState,
    find_resume_point,
    has_manifest,
    newest_resumable,
    prune,
    read_trainer_state,
    resumable,
    saving,
    step_dir,
    write_trainer_state,
)
from logicrl.trainer.curves import plot_curves, plot_phases
from logicrl.trainer.dispatch import PhaseDispatch, timed
from logicrl.trainer.divergence import (
    Diverged,
    DivergenceGuard,
    RejectionGuard,
    diverged_line,
    learning_rates,
    nonfinite_roles,
    nonfinite_state_reason,
)
from logicrl.trainer.dynamic_sampling import FilterMetricError, Round, fill, metric_values, trainable_prompts
from logicrl.trainer.micro_sizes import apply_saved
from logicrl.trainer.resumed import kl_start, recorded, resume_lines
from logicrl.trainer.rewards import RewardManager
from logicrl.trainer.sampler import EpochSampler, record_draws
from logicrl.trainer.step_perf import FlopModel, generation_round, peak_bf16_flops, phase_shares, step_metrics
from logicrl.trainer.step_state import StepState
from logicrl.trainer.summaries import history_row
from logicrl.trainer.tracking import Tracker
from logicrl.trainer.turns import ToolWatch, conversations, data_warning
from logicrl.trainer.validation import scored_samples, val_only_line, validation_metrics, write_samples
from logicrl.workers.hybrid import HybridWorker

log = logging.getLogger("logicrl.trainer")


class PPOTrainer:
    """One run (or one curriculum stage): its workers, its step loop, its checkpoints.

    `init_from` (a curriculum stage's start) is the previous stage's final checkpoint: the models
    start from its weights (and its optimizer state with `carry_optimizer`). A complete checkpoint
    of this run under trainer.default_local_dir (resume_mode=auto), or the one resume_mode names,
    then takes over: the run continues after its step with the same data order, as if never stopped.
    """

    def __init__(self, cfg: DictConfig, plan: StepPlan, run_dir: Path, init_from: Path | None = None,
                 carry_optimizer: bool = False, stage: int | None = None, faults: Faults | None = None,
                 group_cls: type | None = None):
        self.cfg, self.run_dir, self.stage = cfg, run_dir, stage
        self.faults = (faults or Faults()).in_stage(stage)
        data, arr = cfg.data, cfg[ARR]
        self.tokenizer = load_tokenizer(arr.model.path, quiet=True)  # the preflight said what it substituted
        # The preflight checked a sample of the rows (preflight/data.py); this load checks them all,
        # rewards included, with the same one-line errors.
        load = dict(prompt_key=data.prompt_key, max_prompt_length=data.max_prompt_length,
                    truncation=data.truncation, skip_bad_rows=data.skip_bad_rows, row_check=reward_check(cfg),
                    tools=prompt_tools(cfg))
        self.train_set = load_prompts(data.train_files, self.tokenizer, **load)
        self.val_set = load_prompts(data.val_files, self.tokenizer, **load)
        multi_turn = arr.rollout.multi_turn.enable
        if line := data_warning(multi_turn, self.train_set, data.train_files):
            log.warning(line)
        # A multi-turn engine reads each row's extra_info.tools_kwargs; a single-turn one gets the tensors only.
        self.generate_keep = ("extra_info",) if multi_turn else ()
        self.tool_watch = ToolWatch(multi_turn)
        # The plan counted the rows in the files; truncation=filter / skip_bad_rows may keep fewer.
        planned = plan
        self.plan = plan = plan.for_rows(len(self.train_set))
        if plan.total_steps != planned.total_steps:
            log.warning(f"{plan.train_rows} of the {planned.train_rows} training prompts are usable (data.truncation="
                        f"{data.truncation}, data.skip_bad_rows={data.skip_bad_rows}): {plan.total_steps} steps, "
                        f"not the {planned.total_steps} the dry run counted")
        self.sampler = EpochSampler(plan, data.shuffle, data.seed)
        self.total_steps = plan.total_steps
        custom = cfg.reward.custom
        scorer = make_scorer((custom.path, custom.name) if custom.path else None, cfg.reward.timeout_s,
                             cfg.reward.timeout_score)
        overlong = cfg.reward.overlong_buffer
        self.rewards = RewardManager(self.tokenizer, None, dict(overlong) if overlong.enable else None,
                                     combine_rule(cfg), scorer=scorer, custom=bool(custom.path))
        self.kl_ctrl = make_kl_controller(cfg.algorithm.kl_ctrl.type, kl_coef=cfg.algorithm.kl_ctrl.kl_coef,
                                          target_kl=cfg.algorithm.kl_ctrl.target_kl,
                                          horizon=cfg.algorithm.kl_ctrl.horizon)
        use_cuda = torch.cuda.is_available() and cfg.trainer.device != "cpu"
        log.info(f"starting {plan.ranks} rank(s) on {'cuda' if use_cuda else 'cpu'}; "
                 f"{len(self.train_set)} train prompts, {self.total_steps} steps")
        self.ckpt_root = Path(cfg.trainer.default_local_dir)
        resume = find_resume_point(self.ckpt_root, cfg.trainer.resume_mode)
        state = read_trainer_state(resume) if resume is not None else None
        self.start_step, self.history, self.elapsed_s = 0, [], 0.0
        # Generation rounds drawn from the sampler so far: one per step, or with dynamic sampling as many
        # as the steps took (the sampler's position, checkpointed).
        self.rounds = 0
        self.workers = None
        self.resumed: Path | None = None  # the checkpoint this launch resumed
        self.unverified: Path | None = None  # the same, when it had no manifest to verify it against
        self.phase_totals: dict[str, float] = {}  # this launch's time per phase, for the closing line
        self.val_samples: list[dict] = []  # the last validation's scored responses (trainer/evaluation.py)
        arr = cfg[ARR]
        self.flops = FlopModel.of(load_model_spec(arr.model.path), arr.model.lora_rank, arr.model.target_modules)
        self.peak = peak_bf16_flops(torch.cuda.get_device_name(0)) if use_cuda else None
        if state is not None and state.step >= self.total_steps:
            self._adopt(state)
            return
        if cfg.trainer.resume_mode != "disable":
            # Micro-batches an OOM halved before it ended an earlier run here (trainer/micro_sizes.py).
            self.plan = plan = apply_saved(plan, self.ckpt_root)
        log_file = quiet_driver(run_dir, cfg.trainer.verbose)  # engine and Ray output to the log file (logs.py)
        self.workers = self._start_workers(group_cls, use_cuda, log_file)
        self.calls = PhaseDispatch(self.workers, cfg, plan, self.faults, self.ckpt_root)
        if init_from is not None:
            log.info(f"starting from {init_from} (optimizer state {'carried' if carry_optimizer else 'fresh'})")
            self.workers.call("start_from", str(init_from), carry_optimizer)
        if state is not None:
            self._resume(resume, state)

    def _start_workers(self, group_cls: type | None, use_cuda: bool, log_file: str | None):
        """One colocated (hybrid) worker per rank."""
        if group_cls is None:
            # Imported here: the step loop needs only a group's call/dispatch/shutdown, so the GPU
            # tests can run it in-process (tests/gpu/local_group.py) on a machine without Ray.
            from logicrl.controller.worker_group import WorkerGroup

            group_cls = functools.partial(WorkerGroup, heartbeat_s=self.cfg.trainer.collective_timeout_s)
        cfg = self.cfg
        return group_cls(HybridWorker, self.plan.ranks, use_cuda, cfg.trainer.nnodes, cfg.trainer.ray_address,
                         config=OmegaConf.to_container(cfg, resolve=True),
                         plan=self.plan, faults=self.faults, log_file=log_file)

    def sampling(self, draw: int) -> dict:
        """Sampling parameters of the `draw`-th generation round (1-based: the step, without dynamic sampling)."""
        r = self.cfg[ARR].rollout
        return dict(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                    max_tokens=self.cfg.data.max_response_length, seed=self.cfg.trainer.seed * 100_003 + draw)

    def fit(self) -> dict:
        if self.workers is None:
            # The preflight refused a launch that differs from the finished run (preflight/checkpoints.py
            # check_not_done): this is the same run again, as a requeued or repeated job launches it.
            print(f"logicrl: {self.ckpt_root} already holds step {self.start_step} of {self.total_steps} of this "
                  f"run ({newest_resumable(self.ckpt_root).name}): nothing to train; "
                  f"{way_out(self.cfg, self.ckpt_root)}")
            return {}
        tracker = Tracker(self.run_dir, list(self.cfg.trainer.logger), self.total_steps,
                          OmegaConf.to_container(self.cfg, resolve=True), self.cfg.trainer.project_name,
                          self.cfg.trainer.experiment_name)
        last: dict = {}
        save_freq, test_freq = self.cfg.trainer.save_freq, self.cfg.trainer.test_freq
        guard = DivergenceGuard(self.cfg.trainer.max_nonfinite_steps)
        rejection = RejectionGuard(self.cfg.algorithm.rollout_correction)
        try:
            # A stop request (SIGUSR1/SIGTERM: preemption) ends the loop after the step in flight,
            # with that step saved (logicrl/signals.py).
            with stop_at_step_end():
                if self.cfg.trainer.val_only:  # an evaluation: model.path as it is, on the validation files
                    val = self.run_validation(0)
                    tracker.log(val, 0)
                    print(val_only_line(val), flush=True)
                    return val
                if self.cfg.trainer.val_before_train and self.start_step == 0:
                    val = self.run_validation(0)
                    self.history.append(history_row(0, val))
                    tracker.log(val, 0)
                for step in range(self.start_step + 1, self.total_steps + 1):
                    start = time.perf_counter()
                    metrics = self.step(step)
                    if test_freq > 0 and (step % test_freq == 0 or step == self.total_steps):
                        metrics.update(self.run_validation(step))
                    self.elapsed_s += time.perf_counter() - start
                    self.history.append(history_row(step, metrics))
                    stop = requested()
                    try:  # a step that ends the run is logged too: its NaN show where the run diverged
                        if reason := guard.observe(step, metrics):
                            # Not one finite step since this launch resumed: the checkpoint itself is suspect.
                            at_once = self.start_step > 0 and guard.streak[0] == self.start_step + 1
                            raise self.diverged(reason, nonfinite_roles(metrics), at_once)
                        if reason := rejection.observe(step, metrics):
                            raise BadInput(reason)
                        periodic = save_freq > 0 and step % save_freq == 0
                        if periodic and guard.streak and not stop and step < self.total_steps:
                            # Its weights produce NaN, or soon may: the checkpoint from before the streak
                            # stays the newest, the one resume_mode=auto picks if the guard ends the run.
                            log.warning(f"step {step} not saved: {len(guard.streak)} non-finite step(s) in a row")
                        elif stop or step == self.total_steps or periodic:
                            metrics.update(self.save(step))
                    finally:
                        for key, value in metrics.items():  # the closing line's breakdown, the save's time too
                            if key.startswith("timing_s/") and key != "timing_s/step":
                                self.phase_totals[key[9:]] = self.phase_totals.get(key[9:], 0.0) + value
                        tracker.log(metrics, step)
                    last = metrics
                    if stop and step < self.total_steps:
                        raise Preempted(stop, step, str(step_dir(self.ckpt_root, step)))
        finally:
            tracker.close()
            self.rewards.close()
            self.workers.shutdown()
        png, phases_png = ((plot_curves(self.run_dir), plot_phases(self.run_dir)) if self.cfg.trainer.plot_curves
                           else (None, None))
        shares = phase_shares(self.phase_totals)
        print(f"logicrl: {self.total_steps} steps done; metrics in {self.run_dir / 'metrics.jsonl'}"
              + (f", curves in {png}" if png else "")
              + (f"; time by phase: {shares}" if shares else "")
              + (f" (per step in {phases_png})" if phases_png else ""))
        return last

    # ---------------------------------------------------------------- checkpoints
    def save(self, step: int) -> dict:
        """global_step_N/ under the checkpoint root, committed atomically, then old ones pruned. Never
        from NaN/inf: the ranks check their shards first, so the newest checkpoint is always finite."""
        t = self.cfg.trainer
        start = time.perf_counter()
        parts = sorted({part for rank in self.workers.call("nonfinite_state") for part in rank})
        if parts:
            raise self.diverged(nonfinite_state_reason(parts, step), [part.split()[0] for part in parts])
        with saving(self.ckpt_root, step) as tmp:
            rank_metrics = self.workers.call("save_checkpoint", str(tmp), t.save_hf_model, t.save_merged_lora)
            position = self.rounds if self.plan.filter_groups else step
            state = TrainerState(step=step, sampler_position=position, kl_coef=float(self.kl_ctrl.value),
                                 curriculum_stage=self.stage, rng=capture_rng_state(),
                                 extra={"history": self.history, "elapsed_s": self.elapsed_s,
                                        "train_batch_size": self.plan.prompts,
                                        "train_rows": len(self.train_set), **self._state_extra(step, tmp)})
            write_trainer_state(tmp, state)
            write_run_shape(tmp, self.cfg)  # what it fits, for the next run's preflight (preflight/checkpoints.py)
            self.faults.kill_if_due("save", step)
        pruned = prune(self.ckpt_root, t.max_actor_ckpt_to_keep)
        log.info(f"saved {step_dir(self.ckpt_root, step)}" + (f"; pruned {len(pruned)} older" if pruned else ""))
        return merge_rank_metrics(rank_metrics) | {"timing_s/save": time.perf_counter() - start}

    def _state_extra(self, step: int, directory: Path) -> dict:
        """What a loop of another shape adds to the checkpoint's trainer state, and writes into `directory`
        (nothing here)."""
        return {}

    def diverged(self, reason: str, roles: list[str], at_once: bool = False) -> Diverged:
        """The error that ends a diverged run: the reason, the lr to lower, the checkpoint to go back to.
        `at_once`: no step since this launch resumed was finite, so the checkpoint it resumed is named as
        the likely cause, with the one before it."""
        lrs = learning_rates(self.cfg)
        found = [path for _, path in resumable(self.ckpt_root)]
        newest = self.resumed if at_once else found[0] if found else None
        last = (step_of(newest), newest) if newest is not None else None
        older = next((p for p in found if step_of(p) < last[0]), None) if at_once else None
        return Diverged(diverged_line(reason, roles, lrs, last, way_out(self.cfg, self.ckpt_root),
                                      unverified=newest is not None and newest == self.unverified,
                                      resumed=at_once, older=older))

    def _adopt(self, state: TrainerState) -> None:
        """The controller's side of a checkpoint: where the run is, its history, KL coef and RNG."""
        self.start_step, self.history = state.step, list(state.extra.get("history", []))
        self.rounds = state.sampler_position  # generation rounds drawn (the step, without dynamic sampling)
        self.elapsed_s = float(state.extra.get("elapsed_s", 0.0))
        if state.kl_coef is not None:
            self.kl_ctrl.value = state.kl_coef
        restore_rng_state(state.rng)

    def _resume(self, path: Path, state: TrainerState) -> None:
        saved = (state.extra.get("train_batch_size"), state.extra.get("train_rows"))
        if saved != (self.plan.prompts, len(self.train_set)):
            log.warning(f"{path} was saved with train_batch_size, rows = {saved}, this run has "
                        f"{(self.plan.prompts, len(self.train_set))}: the data order will differ")
        self.workers.call("resume_from", str(path))
        self.resumed = path
        if not has_manifest(path):
            # Nothing vouched for its bytes (trainer/checkpoint.py verified): NaN or inf from a damaged
            # shard shows here, before a step blames the lr for it.
            self.unverified = path
            if parts := sorted({part for rank in self.workers.call("nonfinite_state") for part in rank}):
                raise BadInput(f"{path} has no MANIFEST.json to verify it against, and once loaded its "
                               f"{' and '.join(parts)} hold NaN or inf: it is damaged; move it aside (mv {path} "
                               f"{path}.damaged) and the same command resumes from the one before it, or "
                               f"{way_out(self.cfg, self.ckpt_root)}")
        self._adopt(state)
        old = recorded(path, state, self.cfg)
        self.kl_ctrl.value = kl_start(self.cfg, state, old)
        for line in resume_lines(path, state, self.cfg, old):
            log.info(line)
        log.info(f"resumed from {path} at step {state.step}; {self.total_steps - state.step} steps to go")

    # ---------------------------------------------------------------- the step
    def step(self, step: int) -> dict:
        cfg, plan = self.cfg, self.plan
        state = StepState(step)
        metrics = state.metrics
        start = time.perf_counter()
        first_round = self.rounds
        if plan.filter_groups:
            batch, prompts = self._dynamic_batch(state)
            token_scores = batch.pop("token_level_scores") if batch is not None else None
        else:
            rows = [self.train_set[i] for i in self.sampler.batch(step - 1)]
            self.rounds, prompts = step, len(rows)
            batch, token_scores, reward_metrics, _ = self._generate_and_score(rows, 0, state, self.sampling(step),
                                                                              balance=True)
            metrics.update(reward_metrics)
        if batch is not None:
            self._train(state, batch, token_scores)
            metrics.update(shape_metrics(batch, cfg.data.max_prompt_length, cfg.data.max_response_length))
            self.tool_watch.observe(step, metrics)
        metrics.update(merge_rank_metrics(state.rank_metrics))
        # What this step really ran (a curriculum stage's batch size and rollout.n show here).
        metrics["batch/prompts"] = float(prompts)
        metrics["batch/responses"] = float(len(batch)) if batch is not None else 0.0
        # What loading did to the training set, in every step's row so no curve hides it.
        data = self.train_set
        metrics.update({"data/prompts_truncated": float(data.truncated), "data/prompts_filtered":
                        float(data.too_long_filtered), "data/rows_skipped": float(data.bad_rows_skipped)})
        metrics["timing_s/step"] = time.perf_counter() - start
        metrics.update(self._perf_metrics(batch, state))
        metrics["perf/rollout_tokens_per_s"] = metrics["perf/gen_tokens_per_s"]
        record_draws(self.run_dir, step, self.sampler, range(first_round, self.rounds))
        return metrics

    def _generate_and_score(self, rows: list, first_uid: int, state: StepState, params: dict,
                            balance: bool) -> tuple[TensorDict, torch.Tensor, dict, list[dict]]:
        """One generation round: `rows`' prompts x n generated, balanced across the training ranks
        (`balance`), scored."""
        plan = self.plan
        batch = prompt_batch(rows, plan.n, self.tokenizer.pad_token_id, first_uid)
        self._generate(batch, state, params)
        state.generated.append(generation_round(batch["response_attention_mask"], plan.generating_ranks))
        if balance and self.cfg.trainer.balance_batch and plan.training_ranks > 1:
            batch = batch[torch.tensor(balanced_order(batch["attention_mask"].sum(-1).tolist(), plan.training_ranks))]
        if plan.runs("reward_model"):
            # The prompts' chats travel with the shards: a reward model with its own tokenizer re-renders them.
            self.calls.run("reward_model", batch, state, keep=("raw_prompt",))
        with timed(self.faults, "reward", state):
            token_scores, reward_metrics, _, results = self.rewards(batch)
        return batch, token_scores, reward_metrics, results

    def _generate(self, batch: TensorDict, state: StepState, params: dict) -> None:
        """The responses of `batch`'s prompts, added to it: here generated now, by the weights of the last update."""
        self.calls.run("generate", batch, state, keep=self.generate_keep, params=params)

    def _dynamic_batch(self, state: StepState) -> tuple[TensorDict | None, int]:
        """DAPO's dynamic sampling (trainer/dynamic_sampling.py): rounds of data.gen_batch_size prompts until
        train_batch_size groups with a spread are kept; the batch to train (None: nothing) and the prompts drawn."""
        cfg, plan = self.cfg, self.plan
        fg = cfg.algorithm.filter_groups
        step, metrics = state.step, state.metrics

        def next_round(i: int) -> Round:
            rows = [self.train_set[j] for j in self.sampler.batch(self.rounds)]
            self.rounds += 1
            batch, scores, reward_metrics, results = self._generate_and_score(
                rows, i * plan.round_prompts, state, self.sampling(self.rounds), balance=False)
            batch["token_level_scores"] = scores
            try:
                values = metric_values(fg.metric, scores, results)
            except FilterMetricError as err:
                raise BadInput(str(err)) from None
            return Round(batch, values, reward_metrics)

        filled = fill(next_round, plan.prompts, plan.n, plan.max_gen_rounds, fg.max_empty_rounds,
                      cat=lambda parts: cat_rounds(parts, self.tokenizer.pad_token_id))
        metrics.update(filled.reward_metrics)
        metrics.update(filled.step_metrics())
        batch = filled.batch
        if filled.short:
            if filled.empty >= fg.max_empty_rounds:
                limit = (f"{filled.rounds} generation rounds, the last {filled.empty} keeping no group (algorithm."
                         f"filter_groups.max_empty_rounds={fg.max_empty_rounds}: is the reward the same for every "
                         "response of a prompt?)")
                raise_it = "check the reward, raise max_empty_rounds"
            else:
                limit = (f"{filled.rounds} generation rounds (algorithm.filter_groups.max_num_gen_batches="
                         f"{fg.max_num_gen_batches})")
                raise_it = "raise the limit (0: none)"
            if fg.on_limit == "error":
                raise BadInput(f"step {step}: {filled.kept} of data.train_batch_size={plan.prompts} groups have a "
                               f"spread in {fg.metric} after {limit}: {raise_it}, or set "
                               "algorithm.filter_groups.on_limit=train")
            minis = [plan.actor.mini_prompts] + ([plan.critic.mini_prompts] if plan.critic else [])
            kept = trainable_prompts(filled.kept, minis)
            log.warning(f"step {step}: {filled.kept} of {plan.prompts} groups kept after {limit}: "
                        + (f"training on {kept} prompts (whole mini-batches)" if kept else
                           f"fewer than one mini-batch ({max(minis)} prompts), no update this step"))
            batch = batch[:kept * plan.n] if kept else None
        if batch is not None and cfg.trainer.balance_batch and plan.training_ranks > 1:
            batch = batch[torch.tensor(balanced_order(batch["attention_mask"].sum(-1).tolist(), plan.training_ranks))]
        return batch, filled.prompts

    def _train(self, state: StepState, batch: TensorDict, token_scores: torch.Tensor) -> None:
        """The step after its batch is scored: forward passes, advantages, updates, weight sync."""
        cfg, plan = self.cfg, self.plan
        step, metrics = state.step, state.metrics
        for phase in SCORING_PASSES:
            if plan.runs(phase):
                self.calls.run(phase, batch, state)
        if cfg.algorithm.rollout_correction.bypass_mode:  # verl's bypass: the engine's policy is pi_old
            batch["old_log_probs"] = batch["rollout_log_probs"]

        with timed(self.faults, "advantages", state):
            rewards = token_scores
            if cfg.algorithm.use_kl_in_reward:
                rewards, kl_metrics = self._kl_in_reward(batch, token_scores)
                metrics.update(kl_metrics)
            a = cfg.algorithm
            # Estimators, their metrics and the KL in the reward read the loss mask (response_mask).
            advantages, returns = compute_advantage(
                a.adv_estimator, rewards, batch["response_mask"], index=batch["uid"],
                values=batch.get("values", None), gamma=a.gamma, lam=a.lam,
                norm_adv_by_std_in_grpo=a.norm_adv_by_std_in_grpo,
                norm_adv_by_std_in_gae=a.norm_adv_by_std_in_gae)
            batch["advantages"], batch["returns"] = advantages, returns
            adv_metrics = advantage_metrics(advantages, returns, batch["response_mask"])
            metrics.update({k: float(v) for k, v in adv_metrics.items()})

        if plan.runs("update_critic"):
            self.calls.run("update_critic", batch, state)
        if step > cfg.trainer.critic_warmup:
            self.calls.run("update_actor", batch, state)
            self._after_update(state)

    def _after_update(self, state: StepState) -> None:
        """The actor's new weights into the engine: their version is the step."""
        self.calls.run("update_weights", None, state, version=state.step)

    def _perf_metrics(self, batch: TensorDict | None, state: StepState) -> dict:
        """Where the step's time went (trainer/step_perf.py): generation, forward passes, updates, MFU."""
        plan = self.plan
        # Each update phase's epochs over its model's mini-batches (plan.actor, plan.critic: None without one).
        updates = {name: getattr(plan, phase_row(name).model) for name in UPDATE_PHASES}
        epochs = {name: u.ppo_epochs if u is not None else 1 for name, u in updates.items()}
        return step_metrics(state.generated, state.rank_times("generate"), state.metrics,
                            None if batch is None else batch["attention_mask"], epochs, self.flops,
                            self.cfg[ARR].model.enable_gradient_checkpointing, plan.training_ranks, self.peak)

    def _kl_in_reward(self, batch, token_scores):
        old = batch.get("old_log_probs", None)
        rewards, kl = apply_kl_penalty(token_scores, old, batch["ref_log_probs"], batch["response_mask"],
                                       self.kl_ctrl.value, self.cfg.algorithm.kl_penalty)
        current = float(kl)
        self.kl_ctrl.update(current, n_steps=len(token_scores))
        return rewards, {"actor/reward_kl_penalty": current, "actor/reward_kl_coef": self.kl_ctrl.value}

    def run_validation(self, step: int) -> dict:
        """Generate for every validation prompt (val_kwargs.n each) on the step's path, score, report."""
        n, params = eval_sampling(self.cfg)  # eval.n / eval.temperature, else rollout.val_kwargs
        params.update(max_tokens=self.cfg.data.max_response_length, seed=self.cfg.trainer.seed)
        batch = prompt_batch(list(self.val_set), n, self.tokenizer.pad_token_id)
        state = StepState(None)  # its own: nothing of it goes into the step's row
        self.calls.run("generate", batch, state, keep=self.generate_keep, params=params)
        if self.plan.runs("reward_model"):  # as verl: validation's rewards combine the learned score too
            self.calls.run("reward_model", batch, state, keep=("raw_prompt",))
        _, _, texts, results = self.rewards(batch)
        write_samples(self.run_dir, step, batch, texts, results, conversations(batch, self.tokenizer))
        # Every response with its answer and whether it ended: pass@k, maj@k and intervals (logicrl/eval/).
        self.val_samples = scored_samples(batch, texts, results, n, self.cfg.data.max_response_length,
                                          eos_ids(self.tokenizer, checkpoint_dir(self.cfg[ARR].model.path)))
        return validation_metrics(batch, results) | flat_metrics(group_metrics(self.val_samples, self.cfg.eval.k))
