"""A rank's trained state (the actor, and the critic when there is one) to and from checkpoints.

The functions take the `Models` record of workers/build.py, so any worker that trains composes them
(the colocated one today, a trainer-only one next). The file format is workers/checkpoint.py's; the
controller commits the directory (trainer/checkpoint.py). The reference and the reward model are frozen:
they load again from their paths, never from a checkpoint.
"""

from __future__ import annotations

from pathlib import Path

from logicrl.workers.checkpoint import load_sharded, load_stage_start, save_sharded
from logicrl.workers.fsdp import has_nonfinite, offload_optimizer, optimizer_tensors
from logicrl.workers.hf_export import export_hf


def trained_parts(models) -> list:
    return [part for part in (models.actor, models.critic) if part is not None]


def nonfinite_state(models) -> list[str]:
    """What of this rank's trained state holds NaN or inf ("actor weights", "critic optimizer state"):
    the controller asks before every save and saves nothing if any rank names something. Each rank
    checks only its own shards and the controller ORs the answers, so no collective runs here."""
    found = []
    for part in trained_parts(models):
        if has_nonfinite(p for p in part.model.parameters() if p.requires_grad):
            found.append(f"{part.role.name} weights")
        if has_nonfinite(optimizer_tensors(part.optimizer)):
            found.append(f"{part.role.name} optimizer state")
    return found


def save(models, directory: Path, save_hf: bool, merge_lora: bool, source_path: str, dtype, fault=None) -> None:
    """Every rank writes its shards into `directory` (the controller's tmp dir, committed after)."""
    # With LoRA only the adapter trains: the base comes back from model.path on load.
    save_sharded(directory / "actor", models.actor.model, models.actor.optimizer, models.actor.scheduler,
                 trainable_only=models.lora, fault=fault)
    if models.critic is not None:
        save_sharded(directory / "critic", models.critic.model, models.critic.optimizer, models.critic.scheduler)
    if save_hf:
        export_hf(models.actor.model, directory / "huggingface", source_path, merge_lora=merge_lora, dtype=dtype)


def resume(models, directory: Path) -> None:
    """Weights, optimizer, scheduler and RNG of the actor (and critic), as saved."""
    load_sharded(directory / "actor", models.actor.model, models.actor.optimizer, models.actor.scheduler)
    if models.critic is not None:
        load_sharded(directory / "critic", models.critic.model, models.critic.optimizer, models.critic.scheduler,
                     restore_rng=False)
    park_optimizers(models)


def start_stage(models, directory: Path, carry_optimizer: bool) -> None:
    """Start a curriculum stage from the previous stage's final checkpoint.

    The actor (and, when both stages have one, the critic) takes its weights; so does the reference model,
    as in Logic-RL, where each stage is a new run from the last stage's weights (with LoRA the reference
    stays the base model: the adapter switched off). The lr schedule restarts; the Adam moments come along
    only with `carry_optimizer`.
    """
    parts = [(models.actor, directory / "actor")]
    if models.critic is not None and (directory / "critic").is_dir():
        parts.append((models.critic, directory / "critic"))
    for part, path in parts:
        load_stage_start(path, part.model, part.optimizer, part.scheduler, carry_optimizer)
    if models.ref is not None:
        load_sharded(directory / "actor", models.ref, None, restore_rng=False)
    park_optimizers(models)


def park_optimizers(models) -> None:
    """A loaded checkpoint puts AdamW's states beside the parameters; optimizer_offload keeps them on the
    host until the next update (workers/update.py)."""
    for part in trained_parts(models):
        if part.role.optimizer_offload:
            offload_optimizer(part.optimizer)
