"""Every schema key is read by code, or is in the one table of keys accepted and ignored.

"Read" is found by an AST scan of logicrl/ and main_ppo.py (schema.py left out): a key's leaf name
used as an attribute (`cfg.data.shuffle`), as a subscript or as a string argument of getattr,
OmegaConf.select/update, .get or .pop, as a parameter of a registered policy loss, or the whole dotted
key as a string (migrate.py's tables; not the table of ignored keys itself, nor a verl key's rename target).
Words in error messages do not count. A leaf name shared by several keys (`path`, `n`) is found
through any of them, so the scan proves little for those; it is exact for the distinctive ones.
"""

from __future__ import annotations

import ast
import logging
from dataclasses import is_dataclass
from pathlib import Path

import pytest

from logicrl.config import compose, validate
from logicrl.config.migrate import IGNORED_KEYS
from logicrl.config.schema import iter_fields

ROOT = Path(__file__).resolve().parents[2]
READERS = ("getattr", "hasattr", "setattr", "select", "update", "get", "pop")
IGNORED = {key for key, _, _ in IGNORED_KEYS}


def leaf_keys() -> list[str]:
    return [name for name, f in iter_fields() if not is_dataclass(f.default_factory)]


def string_parts(node: ast.AST) -> list[str]:
    """The dotted words of a string constant or of an f-string's constant parts."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.split(".")
    if isinstance(node, ast.JoinedStr):
        return [w for v in node.values if isinstance(v, ast.Constant) for w in str(v.value).split(".")]
    return []


def names_read() -> tuple[set[str], set[str]]:
    """(leaf names read, whole dotted keys written as strings) in the code, the ignore table excepted."""
    leaves, whole = set(), set()
    files = [p for p in (ROOT / "logicrl").rglob("*.py") if p != ROOT / "logicrl/config/schema.py"]
    for path in [*files, ROOT / "main_ppo.py"]:
        tree = ast.parse(path.read_text())
        # The table names keys in order to ignore them: that is not reading them.
        tree.body = [n for n in tree.body if not (isinstance(n, ast.Assign) and
                                                  any(getattr(t, "id", "") == "IGNORED_KEYS" for t in n.targets))]
        # verl_keys.rename(target) writes its target key; that is not reading it either.
        written = {id(a) for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "rename"
                   for a in n.args}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                leaves.add(node.attr)
            elif isinstance(node, ast.Subscript):
                leaves.update(string_parts(node.slice))
            elif isinstance(node, ast.Call):
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if func in READERS:
                    for arg in node.args:
                        leaves.update(string_parts(arg))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in written:
                whole.add(node.value)
            elif isinstance(node, ast.FunctionDef) and any(
                    getattr(getattr(d, "func", None), "id", "") == "register_policy_loss" for d in node.decorator_list):
                # The actor passes the policy_loss group whole: a loss reads a key by naming its parameter.
                leaves.update(a.arg for a in node.args.args + node.args.kwonlyargs)
    return leaves, whole


def test_every_schema_key_is_read_or_listed_as_ignored():
    leaves, whole = names_read()
    unread = {k for k in leaf_keys() if k.rsplit(".", 1)[-1] not in leaves and k not in whole}
    # Both ways: nothing unread is missing from the table, and nothing in it is secretly read.
    assert unread == IGNORED, (f"read by no code, add to migrate.IGNORED_KEYS or read them: "
                               f"{sorted(unread - IGNORED)}; "
                               f"listed as ignored but read: {sorted(IGNORED - unread)}")


def test_ignored_keys_are_schema_keys():
    assert IGNORED <= set(leaf_keys())


@pytest.mark.parametrize("key, inert, _", IGNORED_KEYS)
def test_an_ignored_key_warns_once_only_when_it_asks_for_something(key, inert, _, data_files, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        validate(compose([*data_files, f"{key}={'null' if inert is None else str(inert).lower()}"]))
    assert not [r for r in caplog.records if key in r.getMessage()]
    asking = "hdfs://x" if key.endswith("hdfs_dir") else 8 if inert is None else not inert
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        validate(compose([*data_files, f"{key}={asking}"]))
    warned = [r.getMessage() for r in caplog.records if key in r.getMessage()]
    assert len(warned) == 1 and f"{key}={asking} is ignored: " in warned[0] and "\n" not in warned[0]
