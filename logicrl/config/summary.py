"""The dry-run summary: one screen saying what a step will do, on which data and model."""

from __future__ import annotations

import json

from omegaconf import DictConfig

from logicrl.config.batching import ARR, BatchPlan, UpdatePlan, uses_ref
from logicrl.data.files import dataset_rows
from logicrl.models.spec import ModelSpec


def steps_per_epoch(train_rows: int, prompts: int) -> int:
    # The last incomplete batch is dropped, as verl does: every step sees the same batch size.
    return train_rows // prompts


def _update_lines(name: str, plan: BatchPlan, role: UpdatePlan) -> list[str]:
    if role.micro is None:
        split = "packed into micro-batches by token budget (use_dynamic_bsz)"
    else:
        split = f"{role.grad_accum} micro-batches of {role.micro} (gradient accumulation {role.grad_accum})"
    return [
        f"{name:<10} {role.num_mini} mini-batches of {role.mini_prompts} prompts ({role.mini_prompts * plan.n} "
        f"responses) x {role.ppo_epochs} epochs = {role.optimizer_steps} optimizer steps per step",
        f"{'':<10} per rank: a mini-batch is {role.per_rank_mini} responses = {split}",
    ]


def summarize(cfg: DictConfig, spec: ModelSpec, plan: BatchPlan, memory: str | None = None) -> str:
    """The dry-run summary; `memory` is the preflight's table when the caller already ran it
    (logicrl.memory.preflight.preflight), else the plan is computed here without refusing."""
    data, trainer = cfg.data, cfg.trainer
    train_rows, val_rows = dataset_rows(data.train_files), dataset_rows(data.val_files)
    per_epoch = steps_per_epoch(train_rows, plan.prompts)
    total = trainer.total_training_steps or per_epoch * trainer.total_epochs
    ref = f"ref log-prob: {plan.forwards(plan.ref_micro)} forwards of <= {plan.ref_micro}" if plan.ref_micro else \
        "no reference (no KL term)"
    lines = [
        "logicrl dry run: the config is valid; no model was loaded and no Ray worker was started."
        if trainer.dry_run else "logicrl: the config is valid; the plan:",
        f"{'model':<10} {spec.describe()}, dtype {cfg[ARR].model.dtype}",
        f"{'data':<10} train {train_rows} prompts ({_files(data.train_files)}), val {val_rows} prompts "
        f"({_files(data.val_files)})",
        f"{'':<10} prompts <= {data.max_prompt_length} tokens, responses <= {data.max_response_length} tokens; "
        f"{per_epoch} steps per epoch, {total} steps in all",
        f"{'algorithm':<10} {cfg.algorithm.adv_estimator}, rollout {cfg[ARR].rollout.name}, "
        f"critic {'yes' if plan.critic else 'no'}, reference {'yes' if plan.ref_micro else 'no'}",
        f"{'ranks':<10} {plan.ranks} ({trainer.nnodes} node(s) x {trainer.n_gpus_per_node}), device {trainer.device}",
        f"{'per step':<10} {plan.prompts} prompts x n={plan.n} = {plan.responses} responses; "
        f"{plan.per_rank_responses} responses per rank",
        *_update_lines("actor", plan, plan.actor),
        *(_update_lines("critic", plan, plan.critic) if plan.critic else []),
        f"{'forwards':<10} per rank: old log-prob {plan.forwards(plan.log_prob_micro)} forwards of <= "
        f"{plan.log_prob_micro}; {ref}",
    ]
    if uses_ref(cfg) and cfg[ARR].model.lora_rank > 0:
        lines.append(f"{'':<10} with LoRA the reference is the actor with its adapter disabled (no second copy)")
    if memory is None:
        # Imported here: logicrl.memory imports this package's batching module.
        from logicrl.memory.preflight import memory_summary

        memory = memory_summary(cfg, spec)
    lines.append(memory)
    return "\n".join(lines)


def _files(files) -> str:
    return files if isinstance(files, str) else json.dumps(list(files))
