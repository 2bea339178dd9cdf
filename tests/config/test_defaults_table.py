"""Defaults follow verl's, and docs/configuration.md's table of those that differ is the config's own: every
key whose logicrl default (preset=verl) or embedded default differs from verl's value (vendored in
verl_defaults.yaml) has its row, with the three values as they are, and every row is such a key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from logicrl.config import compose
from tests.conftest import ROOT

VERL = yaml.safe_load((Path(__file__).parent / "verl_defaults.yaml").read_text())
KEY = re.compile(r"^`([\w.]+)`$")


def flat(node, prefix: str = "") -> dict:
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolved(overrides: list[str]) -> dict:
    return flat(OmegaConf.to_container(compose(overrides), resolve=True))


def cell(text: str):
    """A table cell's value: `1e-6` -> 1e-06, `[console, wandb]` -> a list, `???` (required) -> '???'."""
    text = text.strip()
    if not text:
        return None
    code = re.match(r"^`([^`]*)`", text)
    assert code, f"a value cell starts with its value in backticks: {text!r}"
    raw = code.group(1)
    try:
        return float(raw) if re.fullmatch(r"-?[\d.]+e-?\d+", raw) else yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def same(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= 1e-12 * max(abs(a), abs(b), 1)
    return a == b


@pytest.fixture(scope="module")
def table() -> dict:
    text = (ROOT / "docs/configuration.md").read_text()
    section = text[text.index("## Defaults\n"):text.index("## Coming from verl or Logic-RL")]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) == 5 and (m := KEY.match(cells[0])):
            key, (verl, logicrl, embedded, why) = m.group(1), cells[1:]
            assert key not in rows, f"{key} has two rows"
            assert why, f"{key}: the row says why"
            rows[key] = (cell(verl), cell(logicrl), cell(embedded) if embedded.strip() else cell(logicrl))
    assert len(rows) > 20
    return rows


def test_every_key_whose_default_differs_from_verls_has_its_row(table):
    verl_preset, embedded = resolved(["preset=verl"]), resolved([])
    differing = {k for k, v in VERL.items() if not same(verl_preset[k], v) or not same(embedded[k], v)}
    assert sorted(differing - set(table)) == [], "defaults that differ from verl's without a row"
    assert sorted(set(table) - differing) == [], "rows for defaults that no longer differ"
    for key, (verl, logicrl, emb) in table.items():
        assert same(verl, VERL[key]), (key, "verl", verl, VERL[key])
        assert same(logicrl, verl_preset[key]), (key, "logicrl", logicrl, verl_preset[key])
        assert same(emb, embedded[key]), (key, "embedded", emb, embedded[key])


def test_the_vendored_verl_keys_are_logicrls():
    # A key logicrl dropped or renamed would make its row untestable.
    keys = set(resolved(["preset=verl"]))
    assert sorted(set(VERL) - keys) == []
