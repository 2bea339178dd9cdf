"""Command-line side of the config: override checks before Hydra composes, and compose for tests.

Hydra rejects an unknown override key with a multi-line message and exit code 1; logicrl wants
one line, exit code 2 and the closest valid key. So main_ppo checks the override keys against
the schema before handing argv to Hydra. Keys only verl has (verl_keys.py) are let through as
`++key=value`, which Hydra adds to the composed config, where validate maps, ignores or refuses them.
A command line that names a checkpoint (actor_rollout_ref.model.path) gets verl's defaults: `preset=verl`
is added unless it selects a preset itself; the embedded model keeps the embedded default's.
What only composing can find (a `+` on a key the recipe already set, a list index past its end, a
missing config group option) comes out of Hydra as an exception; `hydra_error_line` makes it one line.
"""

from __future__ import annotations

import re
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException

from logicrl.config.errors import ConfigError
from logicrl.config.loss_module import GROUP as LOSS_GROUP
from logicrl.config.schema import all_keys
from logicrl.config.validate import unknown_key
from logicrl.config.verl_keys import verl_rule_key

ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = ROOT / "conf"
RECIPES_DIR = ROOT / "recipes"
CONFIG_NAME = "ppo_trainer"
# A stage's overlay key: `curriculum.stages.<i>.overrides.<key>`. The overlay is a plain mapping that
# may or may not already set the key, so Hydra's `+` (add, refused when set) and plain (set, refused
# when absent) would each fail half the time; such overrides go to Hydra as `++` (add or set).
STAGE_OVERLAY = re.compile(r"^\+{0,2}(curriculum\.stages\.\d+\.overrides\..+)$")
# Hydra flags that take the next argument as their value.
FLAGS_WITH_VALUE = {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-c", "--cfg",
                    "-p", "--package", "--experimental-rerun", "-i", "--info"}


PRESET = "preset"
MODEL_PATH = "actor_rollout_ref.model.path"
EMBEDDED = "embedded:"


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
        if key == PRESET:
            values = o.value()
            presets = sorted(p.stem for p in (CONF_DIR / PRESET).glob("*.yaml"))
            for name in getattr(values, "list", None) or [values]:
                if name not in presets:
                    raise ConfigError(f"preset={name}: there is no conf/preset/{name}.yaml (available: "
                                      f"{', '.join(presets)})")
            continue
        if o.package and key not in valid:  # verl's `group@package=option`: its defaults list, not a key
            raise ConfigError(f"{o.input_line}: selects verl's config group `{key}` (option {o.value()}) for "
                              f"{o.package}; logicrl has no such group: it trains with FSDP2 only, its groups are "
                              "conf/*/ (a recipe: +recipe=NAME)")
        # +key / ++key may add keys; the schema merge catches unknown ones with the same message.
        # A stage's overlay (curriculum.stages.1.overrides.data.train_batch_size=4) is checked with
        # its stage (config/stages.py), where the stage is named in the error.
        if key.startswith("curriculum.stages."):
            continue
        if not (o.is_add() or o.is_force_add() or o.is_delete()) and key not in valid and not verl_rule_key(key) \
                and not list_item(key, valid):
            if key.startswith(f"{LOSS_GROUP}.") and key.count(".") == LOSS_GROUP.count(".") + 1:
                raise ConfigError(f"unknown config key `{key}`: a parameter of your own loss is a new key, "
                                  f"+{key}=..., with {LOSS_GROUP}.module set to the file that registers the loss")
            raise unknown_key(key)
    return rewritten


def list_item(key: str, valid: set[str]) -> bool:
    """`trainer.logger.0`, `data.val_files.1`: an item of a list-valued key. Whether the index exists
    depends on the composed list; Hydra says so if not, and hydra_error_line makes that one line."""
    parts = key.split(".")
    return any(part.isdigit() and ".".join(parts[:i]) in valid for i, part in enumerate(parts) if i)


def for_hydra(argv: list[str]) -> list[str]:
    """argv as Hydra should get it: each plain `key=value` whose key only verl has made `++key=value`
    (Hydra's struct mode refuses a key its config lacks, and force-adding it hands it on to validate:
    verl_keys.py), and a stage's overlay key made `++` (STAGE_OVERLAY)."""
    def rewrite(arg: str) -> str:
        if "=" not in arg or arg.startswith("~"):
            return arg
        if stage := STAGE_OVERLAY.match(arg):
            return f"++{stage.group(1)}"
        return f"++{arg}" if not arg.startswith("+") and verl_rule_key(arg.split("=", 1)[0]) else arg

    out = [rewrite(arg) if is_override else arg for arg, is_override in _tagged(argv)]
    if preset := preset_for(argv):  # beside the model's path: Hydra's parser wants the overrides together
        at = max(i for i, (arg, is_override) in enumerate(_tagged(argv))
                 if is_override and arg.split("=", 1)[0].lstrip("+") == MODEL_PATH)
        out.insert(at + 1, preset)
    return out


def preset_for(argv: list[str]) -> str | None:
    """`preset=verl` when the overrides name a checkpoint and select no preset, else None. The embedded
    default's values (conf/preset/embedded.yaml) serve the embedded model; a verl script, which always
    names its model, gets verl's defaults for every key it leaves out."""
    paths = []
    for arg in override_args(argv):
        key = arg.split("=", 1)[0].lstrip("+~")
        if key == PRESET:
            return None
        if key == MODEL_PATH and "=" in arg and not arg.startswith("~"):
            try:
                o = OverridesParser.create().parse_override(arg)
            except HydraException:
                return None  # check_overrides says what is wrong with it
            values = o.value()
            paths = [str(v) for v in getattr(values, "list", None) or [values]]  # a sweep's choices, or the one
    kinds = {p.startswith(EMBEDDED) for p in paths}
    if len(kinds) > 1:
        raise ConfigError(f"{MODEL_PATH}={','.join(paths)} sweeps the embedded model and checkpoints, whose "
                          "defaults differ (conf/preset/): name preset=verl or preset=embedded")
    return f"{PRESET}=verl" if kinds == {False} else None


def hydra_error_line(err: HydraException) -> str:
    """One line for an override Hydra refused while composing, naming the override and the fix.
    Hydra's messages are several lines (a hint, the full key, the search path); the known ones are
    reworded, any other is its lines joined."""
    text = str(err)
    cause = str(err.__cause__ or "")
    if m := re.search(r"An item is already at '([^']+)'", text):
        key = m.group(1)
        given = re.search(r"Either remove \+ prefix: '([^']+)'", text)
        plain = given.group(1) if given else f"{key}=..."
        return (f"+{plain}: {key} is already set (by the config or a recipe), and `+` only adds a key that is not: "
                f"write {plain} to change it (or ++{plain} to set it either way)")
    if (m := re.search(r"Error merging override (\S+)", text)) and "list index out of range" in cause + text:
        where = re.search(r"full_key: (\S+)\[(\d+)\]", cause + text)
        item = f"{where.group(1)} has no item {where.group(2)}" if where else "a list has no such item"
        given = m.group(1).removeprefix("++") if STAGE_OVERLAY.match(m.group(1)) else m.group(1)  # as typed
        return f"{given}: {item} (items count from 0): use an index it has, or set the whole list (key=[a,b])"
    if m := re.search(r"Multiple values for (\S+)\. To override a value use 'override \S+: (\S+)'", text):
        return (f"{m.group(1)} is selected twice (the second: {m.group(2)}): select one "
                f"(a recipe that builds on another names it in its defaults)")
    if m := re.search(r"Could not delete from config\. '([^']+)' does not exist", text):
        return f"~{m.group(1)}: there is no {m.group(1)} in the config to delete: check the key's spelling"
    if isinstance(err, MissingConfigException):
        found = re.search(r"Could not find '([^']+)'", text)
        options = re.search(r"Available options in '([^']+)':\n((?:\t.*\n?)+)", text)
        what = f"{found.group(1).replace('/', '=', 1)}: there is no such config" if found else text.splitlines()[0]
        if options:
            available = ", ".join(o.strip() for o in options.group(2).splitlines())
            what += f" (available for {options.group(1)}: {available})"
        return what
    lines = [line.strip() for line in text.split("Config search path:")[0].splitlines() if line.strip()]
    first_cause = cause.splitlines()[0] if cause else ""
    return "; ".join(lines + ([first_cause] if first_cause and first_cause not in text else [])) or type(err).__name__


def yaml_error_line(err: Exception) -> str:
    """One line for a YAML file Hydra could not parse (a recipe, a conf/ group): the file, line and column
    PyYAML marks, and what it found there."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f"{mark.name} line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "a config file"
    what = " ".join(filter(None, (getattr(err, "context", None), getattr(err, "problem", None)))) or str(err)
    return f"{where}: YAML syntax error: {' '.join(what.split())}; fix that line of the file"


def compose(overrides: list[str] | tuple[str, ...] = ()):
    """Compose the primary config as main_ppo would (used by tests and tools)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        return hydra_compose(CONFIG_NAME, overrides=for_hydra(list(overrides)))
