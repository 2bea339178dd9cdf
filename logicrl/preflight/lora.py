"""LoRA's target_modules against the actor's module names, before the memory plan or any model.

    check_lora(cfg, spec)   # raises ConfigError; nothing to do without LoRA (lora_rank=0)

peft raises only when no module matches (after the model loaded, inside a Ray actor) and silently
drops a list entry that matches nothing, so a typo trains fewer adapters than asked for. Here every
list entry must match a module (one line naming those that do not, with the closest names), and the
whole must pick at least one decoder Linear: that is what the memory planner sizes, weight sync
merges and the log-prob kernel allows (lm_head must stay a plain Linear: models/logprob.py). The
matching rules and where the names come from are in models/lora_targets.py.
"""

from __future__ import annotations

import difflib
import re

from omegaconf import DictConfig, ListConfig

from logicrl.config.errors import ConfigError
from logicrl.config.plan import ARR
from logicrl.memory.footprint import LINEARS, lora_targets
from logicrl.models.lora_targets import ALL_LINEAR, is_all_linear, matches, module_names, target_matches
from logicrl.models.spec import ModelSpec

KEY = f"{ARR}.model.target_modules"


def check_lora(cfg: DictConfig, spec: ModelSpec) -> None:
    model = cfg[ARR].model
    if model.lora_rank == 0 or is_all_linear(model.target_modules):
        return
    targets = list(model.target_modules) if isinstance(model.target_modules, ListConfig) else model.target_modules
    if problem := lora_problem(targets, module_names(model.path, spec), spec.num_layers):
        raise ConfigError(f"{KEY}: {problem} ({ARR}.model.path={model.path})")


def lora_problem(targets: str | list[str], modules: list[str], layers: int) -> str | None:
    """Why `targets` (a regular expression or a list of names) does not pick decoder Linears of a
    model with `modules` (full module names) and `layers` layers, or None."""
    short = sorted({m.rsplit(".", 1)[-1] for m in modules})
    if isinstance(targets, str):
        try:
            picked = [m for m in modules if matches(targets, m)]
        except re.error as err:
            return f"{targets!r} is not a valid regular expression ({err}): use a list of names, e.g. [q_proj,v_proj]"
        if not picked:
            close = [t for t in short if re.search(targets, t)] or difflib.get_close_matches(targets, short, n=3)
            hint = f"; did you mean [{','.join(close)}]?" if close else ""
            return (f"{targets!r} matches no module: a string is a regular expression over full module names "
                    f"(peft's rule), such as model.layers.0.self_attn.q_proj; name modules with a list, or use "
                    f"{ALL_LINEAR}{hint}")
    else:
        unmatched = [t for t in targets if not any(target_matches(str(t), m) for m in modules)]
        if unmatched:
            hints = []
            for t in unmatched:
                close = difflib.get_close_matches(str(t).rsplit(".", 1)[-1], short, n=1)
                hints.append(f"{t} (did you mean {close[0]}?)" if close else str(t))
            linears = [n for n in LINEARS if n in short]
            names = f"Linear modules: {', '.join(linears)}" if linears else f"module names: {', '.join(short[:8])}"
            if len(unmatched) == len(targets):
                return (f"no entry matches a module of the model: {', '.join(hints)} (its {names}; or use "
                        f"{ALL_LINEAR})")
            it = "it" if len(unmatched) == 1 else "them"
            return (f"{', '.join(hints)} {'matches' if len(unmatched) == 1 else 'match'} no module of the model, and "
                    f"peft would silently train without {it}: fix or drop {it} (its {names})")
        picked = [m for m in modules if matches(targets, m)]
    if any(m == "lm_head" or m.endswith(".lm_head") for m in picked):
        return ("it picks lm_head, which must stay a plain Linear for the chunked log-prob kernel "
                "(models/logprob.py): leave lm_head out")
    if not lora_targets(targets, layers):
        return (f"it picks only {', '.join(sorted(picked)[:3])}{' ...' if len(picked) > 3 else ''}, no decoder "
                f"layer Linear: logicrl trains LoRA adapters on {', '.join(LINEARS)}; name some of them or use "
                f"{ALL_LINEAR}")
    return None
