"""Model-directory checks, on hand-made directories and the embedded tiny tokenizer."""

from __future__ import annotations

import json
import struct
import zipfile

import pytest

from logicrl.models.eos import end_of_turn, eos_ids
from logicrl.models.spec import load_model_spec
from logicrl.preflight.models import tokenizer_problem, weights_problem

# The smallest whole files of each kind: a safetensors header holding no tensor, a zip archive.
EMPTY_SAFETENSORS = struct.pack("<Q", 2) + b"{}"


def test_weights_by_name_or_by_index(tmp_path):
    assert "has config.json but no weights" in weights_problem(tmp_path)
    with zipfile.ZipFile(tmp_path / "pytorch_model.bin", "w") as archive:
        archive.writestr("archive/data.pkl", b"x")
    assert weights_problem(tmp_path) is None
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                            "c": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(EMPTY_SAFETENSORS)
    assert weights_problem(tmp_path) == (f"{tmp_path} lacks model-00001-of-00002.safetensors, listed in "
                                         "model.safetensors.index.json: copy the whole checkpoint")
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(EMPTY_SAFETENSORS)
    # Whole files, but the index places tensors in them that their headers do not hold.
    assert "places 'a' in model-00001-of-00002.safetensors, which does not hold it" in weights_problem(tmp_path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from logicrl.models.loading import checkpoint_dir, load_tokenizer
    from logicrl.models.tiny import EMBEDDED_TINY

    return load_tokenizer(EMBEDDED_TINY), checkpoint_dir(EMBEDDED_TINY)


def test_the_tiny_tokenizer_ends_turns_with_its_eos(tiny):
    tokenizer, directory = tiny
    assert end_of_turn(tokenizer) == "<|im_end|>" == tokenizer.eos_token
    assert eos_ids(tokenizer, directory) == [tokenizer.eos_token_id]
    assert tokenizer_problem(tokenizer, directory, load_model_spec(str(directory))) is None


def test_generation_config_adds_its_eos_ids_and_can_name_the_end_of_turn(tiny, tmp_path):
    tokenizer, directory = tiny
    other = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [other, tokenizer.eos_token_id]}))
    assert eos_ids(tokenizer, tmp_path) == [tokenizer.eos_token_id, other]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": other}))
    assert eos_ids(tokenizer, tmp_path) == [tokenizer.eos_token_id, other]


def test_an_eos_that_is_not_the_end_of_turn_is_a_problem_unless_generation_config_lists_it(tiny, tmp_path):
    from copy import deepcopy

    tokenizer, directory = tiny
    wrong = deepcopy(tokenizer)
    wrong.eos_token = "<|endoftext|>"
    spec = load_model_spec(str(directory))
    assert tokenizer_problem(wrong, tmp_path, spec) == (
        f"{tmp_path}: the chat template ends a turn with '<|im_end|>' but the eos token is '<|endoftext|>', so "
        "responses would run past the end of the turn: set eos_token to '<|im_end|>' in tokenizer_config.json, "
        "or list its id in generation_config.json's eos_token_id")
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": tokenizer.eos_token_id}))
    assert tokenizer_problem(wrong, tmp_path, spec) is None


def test_a_tokenizer_larger_than_the_embedding_is_a_problem(tiny):
    from dataclasses import replace

    tokenizer, directory = tiny
    small = replace(load_model_spec(str(directory)), vocab_size=100)
    assert f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is 100" in \
        tokenizer_problem(tokenizer, directory, small)
