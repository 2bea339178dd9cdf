"""LoRA target_modules matched against the model's module names by peft's rules, before the memory
plan: none matching, some not matching, a regex string, lm_head or only embeddings are one line each."""

from __future__ import annotations

import json
import struct

import pytest

from logicrl.config import compose, validate
from logicrl.config.errors import ConfigError
from logicrl.config.phases import ARR
from logicrl.config.stages import Stage
from logicrl.memory.footprint import LINEARS, lora_targets
from logicrl.models.lora_targets import matches, module_names, spec_module_names
from logicrl.models.spec import load_model_spec
from logicrl.models.tiny import EMBEDDED_TINY, TINY_CONFIG
from logicrl.preflight import preflight
from logicrl.preflight.lora import lora_problem

TINY = load_model_spec(EMBEDDED_TINY)
MODULES = spec_module_names(TINY)


def test_the_architecture_names_are_a_qwen2_causal_lms():
    assert TINY.num_layers == 2
    assert len(MODULES) == 3 + TINY.num_layers * 9  # embeddings, final norm, lm_head; 7 Linears and 2 norms a layer
    assert "model.layers.1.self_attn.q_proj" in MODULES and "model.layers.0.mlp.down_proj" in MODULES


@pytest.mark.parametrize("targets, module, expected", [
    (["q_proj"], "model.layers.0.self_attn.q_proj", True),
    (["self_attn.q_proj"], "model.layers.0.self_attn.q_proj", True),  # a dotted suffix
    (["attn.q_proj"], "model.layers.0.self_attn.q_proj", False),  # suffixes end at a dot
    (["proj"], "model.layers.0.self_attn.q_proj", False),
    ("q_proj", "model.layers.0.self_attn.q_proj", False),  # a string is a regex over the full name
    (r".*\.1\..*q_proj", "model.layers.1.self_attn.q_proj", True),
    (r".*\.1\..*q_proj", "model.layers.0.self_attn.q_proj", False),
    (["model.layers.0.mlp.up_proj"], "model.layers.0.mlp.up_proj", True),  # the full name itself
])
def test_matching_is_peft_s(targets, module, expected):
    from peft import LoraConfig
    from peft.tuners.tuners_utils import check_target_module_exists

    assert matches(targets, module) is expected
    assert bool(check_target_module_exists(LoraConfig(target_modules=targets), module)) is expected


def test_the_planner_sizes_what_peft_adapts():
    assert lora_targets("all-linear") == lora_targets("ALL-LINEAR") == LINEARS
    assert lora_targets(["v_proj", "self_attn.q_proj", "mlp.down_proj"]) == ("q_proj", "v_proj", "down_proj")
    assert lora_targets("q_proj") == ()  # peft matches nothing with it either
    assert lora_targets(r".*\.1\..*(k|v)_proj", layers=1) == ()  # layer 1 only: not in a 1-layer model
    assert lora_targets(r".*\.1\..*(k|v)_proj", layers=2) == ("k_proj", "v_proj")


def test_none_matching_is_one_line_with_the_closest_names():
    assert lora_problem(["qq_proj", "vproj"], MODULES, 2) == (
        "no entry matches a module of the model: qq_proj (did you mean q_proj?), vproj (did you mean v_proj?) (its "
        "Linear modules: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj; or use all-linear)")


def test_some_not_matching_are_named_rather_than_silently_dropped():
    assert lora_problem(["q_proj", "v_porj"], MODULES, 2) == (
        "v_porj (did you mean v_proj?) matches no module of the model, and peft would silently train without it: "
        "fix or drop it (its Linear modules: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)")


def test_a_regex_string_that_matches_nothing_says_how_peft_reads_a_string():
    problem = lora_problem("q_proj", MODULES, 2)
    assert problem.startswith("'q_proj' matches no module: a string is a regular expression over full module names")
    assert problem.endswith("did you mean [q_proj]?")
    assert "is not a valid regular expression" in lora_problem("q_proj(", MODULES, 2)
    assert lora_problem(r"model\.layers\.\d+\.self_attn\.(q|v)_proj", MODULES, 2) is None


def test_lm_head_or_only_embeddings_are_refused():
    assert lora_problem(["q_proj", "lm_head"], MODULES, 2).startswith(
        "it picks lm_head, which must stay a plain Linear")
    assert lora_problem(["embed_tokens"], MODULES, 2).startswith(
        "it picks only model.embed_tokens, no decoder layer Linear")
    assert lora_problem(["q_proj", "model.layers.0.mlp.up_proj"], MODULES, 2) is None


def test_module_names_come_from_the_safetensors_header_where_there_is_one(tmp_path):
    assert module_names(EMBEDDED_TINY, TINY) == MODULES
    (tmp_path / "config.json").write_text(json.dumps(TINY_CONFIG))
    assert module_names(str(tmp_path), TINY) == MODULES  # no weights: the architecture's names
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.qkv_proj.weight",
             "model.layers.0.self_attn.qkv_proj.bias"]
    header = json.dumps({n: {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for n in names}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    # A fused projection is what this model holds; the tied lm_head is a module without a tensor of its own.
    assert module_names(str(tmp_path), TINY) == ["lm_head", "model.embed_tokens", "model.layers.0.self_attn.qkv_proj"]
    assert lora_problem(["q_proj"], module_names(str(tmp_path), TINY), 2) == (
        "no entry matches a module of the model: q_proj (did you mean qkv_proj?) (its module names: embed_tokens, "
        "lm_head, qkv_proj; or use all-linear)")


def test_the_preflight_refuses_before_the_memory_planner(data_files, tmp_path):
    # Before: the planner's `max() arg is an empty sequence` traceback.
    cfg, spec, plan = validate(compose([*data_files, "trainer.dry_run=true", f"{ARR}.rollout.name=hf",
                                        f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"{ARR}.model.lora_rank=8",
                                        f"{ARR}.model.target_modules=[qq_proj]"]))
    with pytest.raises(ConfigError, match=rf"^{ARR}.model.target_modules: no entry matches a module of the model: "
                                          rf"qq_proj \(did you mean q_proj\?\).* \({ARR}.model.path=embedded:tiny\)$"):
        preflight([Stage(0, "", cfg, spec, plan)])
