"""A user's policy losses: `actor_rollout_ref.actor.policy_loss.module` and the keys of their parameters.

The module (a .py file or a dotted module name) registers losses with `register_policy_loss`; importing it
adds their names to the loss_mode choices (logicrl/algo_names.py). It is imported on the driver before
validation (`take_loss_params`) and on every rank by the actor, as the custom reward is. A parameter of
a user's loss is a key under policy_loss (`+actor_rollout_ref.actor.policy_loss.my_param=0.5`): such keys
are taken out before the schema merge, checked against the selected loss's signature, and put back into
the validated config (`with_loss_params`), from where the actor passes the whole group to the loss.
Only a run that sets the module imports torch here (a user's loss is torch code).
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import inspect
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from logicrl.config.errors import ConfigError
from logicrl.config.schema import PolicyLossConfig

GROUP = "actor_rollout_ref.actor.policy_loss"
MODULE_KEY = f"{GROUP}.module"
SCHEMA_KEYS = frozenset(f.name for f in fields(PolicyLossConfig))
# Passed by the actor from the actor group, not from policy_loss (verl keeps SAPO's temperatures there).
ACTOR_KEYS = frozenset({"tau_pos", "tau_neg"})


def import_loss_module(module: str | None) -> None:
    """Import the user's loss module once per process (a second import would register its losses twice)."""
    if not module:
        return
    file = Path(module).expanduser()
    try:
        if module.endswith(".py") or file.is_file():
            if not file.is_file():
                raise ConfigError(f"{MODULE_KEY}={module} is not a file (resolved: {file.resolve()}): point it at "
                                  "a Python file that registers losses, or give a dotted module name")
            name = "logicrl_user_loss_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
            if name in sys.modules:
                return
            spec = importlib.util.spec_from_file_location(name, file)
            loaded = importlib.util.module_from_spec(spec)
            sys.modules[name] = loaded
            try:
                spec.loader.exec_module(loaded)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            importlib.import_module(module)
    except ConfigError:
        raise
    # SystemExit too: a module that exits at import must not end validation with its own exit code.
    except (Exception, SystemExit) as error:
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        shows = f"python {module}" if file.is_file() else f"python -c 'import {module}'"
        raise ConfigError(f"{MODULE_KEY}={module} failed to import ({reason:.300}); fix the module "
                          f"({shows} shows the traceback)") from None


def take_loss_params(cfg: DictConfig) -> tuple[DictConfig, dict[str, Any]]:
    """Import the module; returns `cfg` without the policy_loss keys the schema lacks (a copy when there
    are any), and those keys. Without a module such a key is an unknown key, as anywhere else."""
    group = OmegaConf.select(cfg, GROUP)
    if not isinstance(group, DictConfig):
        return cfg, {}
    module = group.get("module")
    extra = [k for k in group if k not in SCHEMA_KEYS]
    if extra and not module:
        raise ConfigError(f"unknown config key `{GROUP}.{extra[0]}`: a parameter of your own loss needs "
                          f"{MODULE_KEY} set to the file that registers it")
    import_loss_module(module)
    if not extra:
        return cfg, {}
    params = {k: OmegaConf.to_container(group[k], resolve=True) if OmegaConf.is_config(group[k]) else group[k]
              for k in extra}
    cfg = copy.deepcopy(cfg)
    group = OmegaConf.select(cfg, GROUP)
    with open_dict(group):
        for k in extra:
            del group[k]
    return cfg, params


def with_loss_params(typed: DictConfig, params: dict[str, Any]) -> DictConfig:
    """Check the user's keys are parameters of the selected loss, and put them back into `typed`."""
    group = OmegaConf.select(typed, GROUP)
    if not group.module:
        return typed
    # Imported only here, with a module given: the user's loss has imported torch anyway.
    from logicrl.algos.policy_loss import POLICY_LOSSES, compute_policy_loss

    mode = group.loss_mode
    declared = inspect.signature(POLICY_LOSSES[mode]).parameters
    dispatched = {p for p in inspect.signature(compute_policy_loss).parameters if p != "params"}
    for key in params:
        if key in dispatched | ACTOR_KEYS:
            actor_key = key in ACTOR_KEYS or key.startswith("clip_ratio")
            where = f"actor_rollout_ref.actor.{key}" if actor_key else "the batch"
            raise ConfigError(f"{GROUP}.{key}: the actor passes {key} to every loss (from {where}): drop the key")
        if key not in declared:
            raise ConfigError(f"{GROUP}.{key} is not a parameter of loss_mode={mode} (it takes "
                              f"{', '.join(declared)}): drop the key, or select the loss that reads it")
    given = dispatched | ACTOR_KEYS | SCHEMA_KEYS | set(params)
    missing = [p for p, d in declared.items() if d.default is d.empty and p not in given]
    if missing:
        raise ConfigError(f"loss_mode={mode} needs {', '.join(missing)}: set "
                          f"+{GROUP}.{missing[0]}=... (its keys go under {GROUP})")
    module = Path(group.module).expanduser()
    # Absolute, so every rank finds the file whatever its working directory (a Ray node elsewhere).
    resolved = {"module": str(module.resolve())} if module.is_file() else {}
    node = OmegaConf.create({**OmegaConf.to_container(group), **params, **resolved})
    OmegaConf.set_struct(node, True)
    typed[GROUP.split(".")[0]].actor.policy_loss = node
    return typed
