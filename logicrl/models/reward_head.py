"""What kind of reward model a checkpoint is, read from its config.json and weight names without torch.

The preflight refuses a checkpoint that cannot score before anything is loaded, so this reads JSON
and safetensors headers only. Two kinds score a prompt + response at its last token with one number:

  classifier   a *ForSequenceClassification (or *ForTokenClassification) with one label: verl's and
               most published reward models (Skywork, FsfairX); their head is `score`
  value_head   any other decoder whose weights hold a trained one-output head of shape [1, hidden]:
               `score.weight` (OpenRLHF's current name) or `value_head.weight` (its older one)

A plain causal LM is refused. verl's worker would load it with a fresh, random head, and a random
score trains the policy towards noise without any error; the critic's fresh head is different,
since the critic is trained.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from logicrl.models.spec import ModelSpecError
from logicrl.models.tiny import EMBEDDED_CONFIGS
from logicrl.models.weight_files import read_header

CLASSIFIER_SUFFIXES = ("ForSequenceClassification", "ForTokenClassification")
# Names of a trained one-output head in a decoder's weights, in the order they are looked for.
HEAD_NAMES = ("score", "value_head")


@dataclass(frozen=True)
class RewardHead:
    kind: str  # "classifier" | "value_head"
    prefix: str  # the head's module name in the checkpoint: "score" or "value_head"
    bias: bool  # whether the head has a bias (a sequence classifier's has none, a token classifier's has)


def num_labels(cfg: dict) -> int:
    # save_pretrained writes id2label, not num_labels; a config with neither has transformers' default, 2.
    if cfg.get("num_labels") is not None:
        return int(cfg["num_labels"])
    return len(cfg["id2label"]) if cfg.get("id2label") else 2


def weight_shapes(directory: Path) -> dict[str, list[int]]:
    """{tensor name: shape} of a checkpoint's safetensors weights (one file or an index); {} without any."""
    index = directory / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else \
        ["model.safetensors"] if (directory / "model.safetensors").is_file() else []
    shapes: dict[str, list[int]] = {}
    for name in files:
        # A damaged header is a WeightFileError (a ModelSpecError): one line naming the file.
        shapes.update({k: v["shape"] for k, v in read_header(directory / name).items()})
    return shapes


def reward_head(path: str) -> RewardHead:
    """The reward head of the checkpoint at `path`; ModelSpecError (one line, with the fix) if it has none."""
    if path in EMBEDDED_CONFIGS:
        cfg, directory = EMBEDDED_CONFIGS[path], None
    else:
        directory = Path(path)
        try:
            cfg = json.loads((directory / "config.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ModelSpecError(f"cannot read {directory / 'config.json'} ({e})") from None
    archs = [str(a) for a in cfg.get("architectures") or []]
    classifier = [a for a in archs if a.endswith(CLASSIFIER_SUFFIXES)]
    if classifier:
        labels = num_labels(cfg)
        if labels != 1:
            raise ModelSpecError(f"{classifier[0]} has {labels} labels; a reward model scores with one: point it at a "
                                 "checkpoint trained with num_labels=1")
        token_level = classifier[0].endswith("ForTokenClassification")
        return RewardHead("classifier", "score", bias=token_level and cfg.get("token_classification_bias", True))
    hidden = cfg.get("text_config", cfg).get("hidden_size")
    shapes = weight_shapes(directory) if directory is not None else {}
    for prefix in HEAD_NAMES:
        if shapes.get(f"{prefix}.weight") == [1, hidden]:
            return RewardHead("value_head", prefix, bias=f"{prefix}.bias" in shapes)
    what = archs[0] if archs else f"a {cfg.get('model_type', 'model')} without architectures"
    raise ModelSpecError(
        f"{what} is neither a sequence classifier with one label (*ForSequenceClassification) nor a decoder "
        f"with a trained value head (score.weight or value_head.weight of shape [1, {hidden}] in its "
        "safetensors weights): point it at a reward model, not a policy checkpoint")
