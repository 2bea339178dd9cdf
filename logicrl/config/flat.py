"""A config as {dotted key: value}: what a checkpoint records of its run, and how two runs are compared.

    flat_config(cfg)   # {"actor_rollout_ref.actor.optim.lr": 0.0005, "trainer.logger": ["console"], ...}
    differences(old, new, ignore)   # [(key, old value, new value)] of the keys both hold

Values go through JSON first, so a config flattened now equals one read back from a file (ints stay
ints, tuples become lists). A key only one side has (added or dropped by another logicrl) is not a
difference: nothing the user changed.
"""

from __future__ import annotations

import json
from fnmatch import fnmatch

from omegaconf import DictConfig, OmegaConf

# Keys a launch may change without being another run: how it is watched, where it reports, whom it
# joins, and which directory it is in. A finished run re-launched with only these changed is the same run.
LAUNCH_ONLY = tuple(f"trainer.{key}" for key in (
    "logger", "verbose", "resume_mode", "dry_run", "ray_address", "ray_dashboard", "collective_timeout_s",
    "default_hdfs_dir", "project_name", "experiment_name", "default_local_dir"))


def flat_config(cfg: DictConfig) -> dict:
    """{dotted key: value} of a resolved config (lists as values)."""
    out: dict = {}

    def walk(node, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(json.loads(json.dumps(OmegaConf.to_container(cfg, resolve=True))), "")  # JSON's types, as read back
    return out


def differences(old: dict, new: dict, ignore: tuple[str, ...] = ()) -> list[tuple[str, object, object]]:
    """(key, old, new) of every key both hold with another value, sorted; keys matching an `ignore`
    pattern (fnmatch) left out."""
    return [(key, old[key], new[key]) for key in sorted(old.keys() & new.keys())
            if old[key] != new[key] and not any(fnmatch(key, pattern) for pattern in ignore)]


def show(value) -> str:
    """As the command line spells it: strings bare, the rest as JSON (null, true, [a, b])."""
    if isinstance(value, float):
        return f"{value:g}"
    return value if isinstance(value, str) else json.dumps(value)
