"""Command-line side of the config: override checks before Hydra composes, and compose for tests.

Hydra rejects an unknown override key with a multi-line message and exit code 1; logicrl wants
one line, exit code 2 and the closest valid key. So main_ppo checks the override keys against
the schema before handing argv to Hydra. Keys only verl has (verl_keys.py) are let through as
`++key=value`, which Hydra adds to the composed config, where validate maps, ignores or refuses them.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException

from logicrl.config.errors import ConfigError
from logicrl.config.schema import all_keys
from logicrl.config.validate import unknown_key
from logicrl.config.verl_keys import verl_rule_key

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
RECIPES_DIR = ROOT / "recipes"
CONFIG_NAME = "ppo_trainer"
# Hydra flags that take the next argument as their value.
FLAGS_WITH_VALUE = {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-c", "--cfg",
                    "-p", "--package", "--experimental-rerun", "-i", "--info"}


def recipe_names() -> list[str]:
    return sorted(str(p.relative_to(RECIPES_DIR).with_suffix("")) for p in RECIPES_DIR.rglob("*.yaml"))


def _tagged(argv: list[str]):
    """(arg, whether it is a key=value override) for each arg: Hydra's flags and their values are not."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
            yield arg, False
        elif arg.startswith("-"):
            skip = arg in FLAGS_WITH_VALUE
            yield arg, False
        else:
            yield arg, True


def override_args(argv: list[str]) -> list[str]:
    """The key=value overrides in argv, Hydra's own flags (and their values) removed."""
    return [arg for arg, is_override in _tagged(argv) if is_override]


def check_overrides(argv: list[str]) -> list[str]:
    """Reject unknown keys and recipes in command-line overrides, before Hydra composes.

    Returns argv with verl-only keys written `++key=value`, for main_ppo to hand to Hydra.
    """
    rewritten = for_hydra(argv)
    try:
        overrides = OverridesParser.create().parse_overrides(override_args(argv))
    except HydraException as e:
        raise ConfigError(f"cannot parse override: {str(e).splitlines()[0]}") from None
    valid = set(all_keys())
    for o in overrides:
        key = o.key_or_group
        if key == "hydra" or key.startswith(("hydra.", "hydra/")):  # Hydra's own, e.g. hydra/launcher=submitit_slurm
            continue
        if key == "recipe":
            values = o.value()
            for name in getattr(values, "list", None) or [values]:
                if not (RECIPES_DIR / f"{name}.yaml").is_file():
                    raise ConfigError(f"+recipe={name}: there is no recipes/{name}.yaml "
                                      f"(available: {', '.join(recipe_names())})")
            continue
        # +key / ++key may add keys; the schema merge catches unknown ones with the same message.
        # A stage's overlay (curriculum.stages.1.overrides.data.train_batch_size=4) is checked with
        # its stage (config/stages.py), where the stage is named in the error.
        if key.startswith("curriculum.stages."):
            continue
        if not (o.is_add() or o.is_force_add() or o.is_delete()) and key not in valid and not verl_rule_key(key):
            raise unknown_key(key)
    return rewritten


def for_hydra(argv: list[str]) -> list[str]:
    """argv with each plain `key=value` whose key only verl has made `++key=value`: Hydra's struct
    mode refuses a key its config lacks, and force-adding it hands it on to validate (verl_keys.py)."""
    def verl_only(arg: str) -> bool:
        return "=" in arg and not arg.startswith(("+", "~")) and bool(verl_rule_key(arg.split("=", 1)[0]))

    return [f"++{arg}" if is_override and verl_only(arg) else arg for arg, is_override in _tagged(argv)]


def compose(overrides: list[str] | tuple[str, ...] = ()):
    """Compose the primary config as main_ppo would (used by tests and tools)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose(CONFIG_NAME, overrides=for_hydra(list(overrides)))
