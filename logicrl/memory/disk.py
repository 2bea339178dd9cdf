"""The preflight's checks of what a run writes: directories writable, disk for a checkpoint."""

from __future__ import annotations

from omegaconf import DictConfig

from logicrl.config.plan import StepPlan
from logicrl.models.spec import ModelSpec


def check_directories(cfg: DictConfig, spec: ModelSpec, plan: StepPlan) -> None:
    """(issue 13, part C)"""
