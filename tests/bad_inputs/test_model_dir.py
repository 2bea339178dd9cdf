"""Bad model directories: one line naming the directory and the fix, not 50-80 lines from a Ray actor.

In-process (`check_main`): the preflight's refusal through the real entry point is test_data.py's.
"""

from __future__ import annotations

import json
import shutil

import pytest

from logicrl.config.phases import ARR
from tests.bad_inputs.conftest import small_run
from tests.conftest import assert_refused, check_main


def no_weights(d):
    for p in d.glob("*.safetensors"):
        p.unlink()


def unknown_model_type(d):
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "model_type": "qwen22"}))


def broken_config(d):
    (d / "config.json").write_text('{"model_type": "qwen2",')


def missing_shard(d):
    (d / "model.safetensors").rename(d / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))


def cut_short(d):
    # A copy that stopped early: the header is whole, the last tensors' bytes are not there.
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])


def no_eos(d):
    # transformers then silently takes <|endoftext|> from elsewhere: generation would run past <|im_end|>.
    config = json.loads((d / "tokenizer_config.json").read_text())
    config.pop("eos_token")
    (d / "tokenizer_config.json").write_text(json.dumps(config))


CASES = {
    "no weights": (no_weights, "has config.json but no weights"),
    "unknown model_type": (unknown_model_type, "model_type='qwen22', which transformers"),
    "config.json that is not JSON": (broken_config, "config.json"),
    "a shard the index lists is missing": (missing_shard, "lacks model-00002-of-00002.safetensors"),
    # Before: the preflight passed and a Ray actor died on SafetensorError minutes later.
    "model.safetensors cut short": (cut_short, "model.safetensors is cut short: tensor"),
    "eos that is not the end of the chat turn": (no_eos, "the chat template ends a turn with '<|im_end|>'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_broken_model_directory_is_one_line(tmp_path, tiny_dir, case):
    breaker, says = CASES[case]
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    breaker(model)
    assert_refused(check_main(*small_run(tmp_path), f"{ARR}.model.path={model}"), f"{ARR}.model.path", str(model), says)


@pytest.mark.parametrize("targets, says", [
    ("[qq_proj,vv_proj]", "no entry matches a module of the model: qq_proj (did you mean q_proj?)"),
    ("[q_proj,v_porj]", "v_porj (did you mean v_proj?) matches no module of the model"),
])
def test_lora_target_modules_that_match_nothing_are_one_line(tmp_path, targets, says):
    # Before: a planner traceback (none matching) or adapters silently missing (some not matching).
    result = check_main(*small_run(tmp_path), f"{ARR}.model.lora_rank=4", f"{ARR}.model.target_modules={targets}")
    assert_refused(result, f"{ARR}.model.target_modules", says)
