"""The preflight's checks of what a run reads: data files and rows, rewards, model directories."""

from __future__ import annotations

from omegaconf import DictConfig


def check_data(cfg: DictConfig) -> None:
    """Every data file readable, its rows well formed, each data_source with a reward (issue 13, part A)."""


def check_models(cfg: DictConfig) -> None:
    """The model directories: config, weights, tokenizer (issue 13, part A)."""
