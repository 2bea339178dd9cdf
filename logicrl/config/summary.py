"""The dry-run summary: one screen saying what a step will do, on which data and model.

Every number comes from the step plan (config/plan.py); the memory table is the preflight's
(logicrl/memory/), passed in by the caller, so this package does not import the planner.
"""

from __future__ import annotations

import json

from omegaconf import DictConfig

from logicrl.config.eval_keys import eval_sampling
from logicrl.config.plan import ARR, StepPlan, Update
from logicrl.data.files import dataset_rows
from logicrl.models.spec import ModelSpec


def _update_lines(name: str, plan: StepPlan, role: Update) -> list[str]:
    if role.micro.by_tokens:
        split = f"packed into micro-batches by token budget (use_dynamic_bsz, {role.micro.describe()})"
    else:
        split = f"{role.grad_accum} micro-batches of {role.micro.value} (gradient accumulation {role.grad_accum})"
    return [
        f"{name:<10} {role.num_mini} mini-batches of {role.mini_prompts} prompts ({role.mini_prompts * plan.n} "
        f"responses) x {role.ppo_epochs} epochs = {role.optimizer_steps} optimizer steps per step",
        f"{'':<10} per rank: a mini-batch is {role.per_rank_mini} responses = {split}",
    ]


def _forward_line(plan: StepPlan, name: str, label: str) -> str:
    phase = plan.phase(name)
    if not phase.runs:
        return f"{label} skipped ({phase.skipped})"
    if phase.micro.by_tokens:
        return f"{label} packed by token budget ({phase.micro.describe()})"
    return f"{label} {plan.forwards(name)} forwards of <= {phase.micro.value}"


def _reward_line(cfg: DictConfig, plan: StepPlan) -> str:
    rm, combine = cfg.reward_model, cfg.reward.combine
    if not rm.enable:
        return f"{'reward':<10} rules by data_source (no reward model)"
    micro = plan.micro("reward_model")
    split = (f"packed by token budget ({micro.describe()})" if micro.by_tokens else
             f"{-(-plan.per_rank_responses // micro.value)} forwards of <= {micro.value}")
    sources = f", by data_source {dict(combine.by_data_source)}" if combine.by_data_source else ""
    return (f"{'reward':<10} reward model {rm.model.path}, per rank {split}; reward.combine.mode={combine.mode}"
            f"{sources}")


def _sampling_lines(cfg: DictConfig, plan: StepPlan) -> list[str]:
    """Dynamic sampling's rounds: what a step may generate before it trains (trainer/dynamic_sampling.py)."""
    if not plan.filter_groups:
        return []
    fg = cfg.algorithm.filter_groups
    rounds = (f"up to {plan.max_gen_rounds} generation rounds" if plan.max_gen_rounds
              else "generation rounds without limit (max_num_gen_batches=0)")
    at_most = (f", at most {plan.max_gen_rounds * plan.round_prompts} prompts"
               if plan.max_gen_rounds else "")
    short = ("train on the whole mini-batches kept" if fg.on_limit == "train" else "end the run")
    return [f"{'sampling':<10} dynamic (algorithm.filter_groups, metric={fg.metric}): {rounds} of "
            f"{plan.round_prompts} prompts x n={plan.n} ({plan.gen_per_rank_responses} responses per rank per "
            f"round){at_most} per step, until {plan.prompts} groups with a spread are kept, or "
            f"{fg.max_empty_rounds} rounds in a row keep none; short at the limit: {short}"]


def _turn_lines(cfg: DictConfig) -> list[str]:
    """The tool loop's turn budget (workers/rollout/multi_turn.py); nothing with tools off."""
    mt = cfg[ARR].rollout.multi_turn
    if not mt.enable:
        return []
    turns = "no turn limit" if mt.max_assistant_turns is None else f"at most {mt.max_assistant_turns} assistant turns"
    tools = ", ".join(p for p in (mt.tool_config_path, mt.function_tool_path) if p) or \
        "the built-in calculator and code_interpreter"
    return [f"{'turns':<10} multi-turn with tools ({tools}): {turns}, {mt.max_parallel_calls} call(s) per turn, "
            f"answers cut to {mt.max_tool_response_length} characters"
            + (f", each answer followed by the opening {mt.assistant_opening!r}" if mt.assistant_opening else "")
            + "; sampled and tool tokens together fit "
            f"data.max_response_length={cfg.data.max_response_length}, the length every phase is planned for"]


def _ranks_lines(cfg: DictConfig, plan: StepPlan) -> list[str]:
    """The ranks and their share of a step: one group, or a trainer and a rollout group (config/async_training.py)."""
    trainer = cfg.trainer
    per_step = f"{'per step':<10} {plan.prompts} prompts x n={plan.n} = {plan.responses} responses; "
    if not plan.rollout_ranks:
        return [f"{'ranks':<10} {plan.ranks} ({trainer.nnodes} node(s) x {trainer.n_gpus_per_node}), device "
                f"{trainer.device}", per_step + f"{plan.per_rank_responses} responses per rank"]
    stale = cfg.async_training.max_staleness
    overlap = ("the next batch generates while this one trains" if stale else
               "each batch generates after the last update's weights arrive, as colocated")
    return [f"{'ranks':<10} two groups ({ARR}.hybrid_engine=false), device {trainer.device}: trainer {plan.ranks} "
            f"({trainer.nnodes} node(s) x {trainer.n_gpus_per_node}) with the trained models, rollout "
            f"{plan.rollout_ranks} ({cfg.rollout.nnodes} node(s) x {cfg.rollout.n_gpus_per_node}) with only the engine",
            f"{'':<10} async_training.max_staleness={stale}: {overlap}; weights broadcast from trainer rank 0 "
            f"after each update (docs/async.md)",
            per_step + f"{plan.per_rank_responses} trained per trainer rank, {plan.gen_per_rank_responses} generated "
            "per rollout rank"]


def _steps(plan: StepPlan) -> str:
    line = f"{plan.steps_per_epoch} steps per epoch, {plan.total_steps} steps in all"
    if plan.max_steps and plan.total_steps < plan.max_steps:
        line += f" (trainer.total_training_steps={plan.max_steps} is more than {plan.total_epochs} epoch(s) hold)"
    return line


def summarize(cfg: DictConfig, spec: ModelSpec, plan: StepPlan, memory: str) -> str:
    """The dry-run summary; `memory` is the preflight's table (logicrl.preflight.memory)."""
    data, trainer = cfg.data, cfg.trainer
    val_rows = dataset_rows(data.val_files)
    if trainer.val_only:
        return _eval_summary(cfg, spec, val_rows, memory)
    lines = [
        "logicrl dry run: the config is valid; no model was loaded and no Ray worker was started."
        if trainer.dry_run else "logicrl: the config is valid; the plan:",
        f"{'model':<10} {spec.describe()}, dtype {cfg[ARR].model.dtype}",
        f"{'data':<10} train {plan.train_rows} prompts ({_files(data.train_files)}), val {val_rows} prompts "
        f"({_files(data.val_files)})",
        f"{'':<10} prompts <= {data.max_prompt_length} tokens, responses <= {data.max_response_length} tokens; "
        f"{_steps(plan)}",
        f"{'algorithm':<10} {cfg.algorithm.adv_estimator}, rollout {cfg[ARR].rollout.name}, "
        f"critic {'yes' if plan.critic else 'no'}, reference {'yes' if plan.runs('ref') else 'no'}",
        *_ranks_lines(cfg, plan),
        *_sampling_lines(cfg, plan),
        *_turn_lines(cfg),
        _reward_line(cfg, plan),
        *_update_lines("actor", plan, plan.actor),
        *(_update_lines("critic", plan, plan.critic) if plan.critic else []),
        f"{'forwards':<10} per rank: {_forward_line(plan, 'old_log_prob', 'old log-prob')}; "
        + (_forward_line(plan, "ref", "ref log-prob:") if plan.runs("ref") else "no reference (no KL term)"),
    ]
    if plan.runs("ref") and cfg[ARR].model.lora_rank > 0:
        lines.append(f"{'':<10} with LoRA the reference is the actor with its adapter disabled (no second copy)")
    if cfg[ARR].model.lora_rank > 0:  # both engines take either sync (docs/engines.md, LoRA)
        lines.append(f"{'':<10} weight sync: " + (
            "LoRA adapters only, the engine holds the base once" if cfg[ARR].rollout.lora_sync == "adapters" else
            "LoRA merged into full weights, the whole model every sync (rollout.lora_sync=merged)"))
    if cfg[ARR].model.quantization:
        lines.append(f"{'':<10} base quantized to {cfg[ARR].model.quantization} as it loads, replicated whole on "
                     "every rank; only the LoRA adapters train (docs/quantization.md)")
    elif spec.quant_method:
        lines.append(f"{'':<10} base pre-quantized: {spec.quant_method} int{spec.quant_bits}, loaded as it is, "
                     "replicated whole on every rank and in the engine (not sharded); only the LoRA adapters train "
                     "(docs/quantization.md)")
    lines.append(memory)
    return "\n".join(lines)


def _eval_summary(cfg: DictConfig, spec: ModelSpec, val_rows: int, memory: str) -> str:
    """trainer.val_only's summary: what is generated and reported; no training step to describe."""
    n, params = eval_sampling(cfg)
    sampling = f"temperature {params['temperature']}" if params["do_sample"] else "greedy"
    return "\n".join([
        "logicrl dry run: the config is valid; no model was loaded and no Ray worker was started."
        if cfg.trainer.dry_run else "logicrl: the config is valid; the plan:",
        f"{'model':<10} {spec.describe()}, dtype {cfg[ARR].model.dtype}",
        f"{'evaluate':<10} {val_rows} prompts ({_files(cfg.data.val_files)}) x n={n} responses ({sampling}, "
        f"<= {cfg.data.max_response_length} tokens) on {cfg.trainer.n_gpus} rank(s); nothing is trained or saved",
        f"{'report':<10} per data_source: mean@{n}, pass@k and maj@k for k in {list(cfg.eval.k)}, completed, "
        "completed_correct, each with a 95% interval over problems",
        memory])


def _files(files) -> str:
    return files if isinstance(files, str) else json.dumps(list(files))
