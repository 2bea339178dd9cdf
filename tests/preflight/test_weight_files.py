"""Weight files checked from their headers: safetensors files cut short or with a damaged range, torch
zip archives cut short, index shards from another export; every model the run loads. Files are built
here byte by byte, so each expected number is read off the bytes written."""

from __future__ import annotations

import json
import struct
import zipfile

import pytest

from logicrl.config import compose, validate
from logicrl.config.errors import ConfigError
from logicrl.config.phases import ARR
from logicrl.models.weight_files import read_header, safetensors_problem, tensor_names, torch_bin_problem
from logicrl.preflight.models import check_weights, weight_paths, weights_problem

RECOPY = "copy it again from the source checkpoint"


def safetensors(path, tensors: dict, *, cut: int = 0, header: dict | None = None):
    """A safetensors file of F32 `tensors` ({name: shape}), laid out in order, `cut` bytes short.
    `header` replaces the header written (to damage it)."""
    entries, offset = {}, 0
    for name, shape in tensors.items():
        size = 4 * (shape[0] * shape[1] if len(shape) == 2 else shape[0])
        entries[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps({"__metadata__": {"format": "pt"}, **(header or entries)}).encode()
    data = struct.pack("<Q", len(raw)) + raw + bytes(offset)
    path.write_bytes(data[:len(data) - cut])
    return 8 + len(raw), offset  # where the data starts, its length


TWO = {"model.embed_tokens.weight": [4, 2], "lm_head.weight": [4, 2]}  # 32 bytes each


def test_a_whole_file_passes_and_its_tensor_names_are_read(tmp_path):
    safetensors(tmp_path / "model.safetensors", TWO)
    assert safetensors_problem(tmp_path / "model.safetensors") is None
    assert weights_problem(tmp_path) is None
    assert tensor_names(tmp_path) == sorted(TWO)


def test_a_file_cut_inside_its_data_names_the_tensor_and_the_missing_bytes(tmp_path):
    start, length = safetensors(tmp_path / "model.safetensors", TWO, cut=10)
    problem = weights_problem(tmp_path)
    assert problem == (f"{tmp_path / 'model.safetensors'} is cut short: tensor 'lm_head.weight' ends at byte "
                       f"{start + 64} but the file has {start + 54} bytes (10 missing): {RECOPY} "
                       "(or re-save the model)")
    assert length == 64


def test_a_file_cut_inside_its_header_or_its_length_field(tmp_path):
    start, _ = safetensors(tmp_path / "a.safetensors", TWO)
    (tmp_path / "b.safetensors").write_bytes((tmp_path / "a.safetensors").read_bytes()[:start - 5])
    assert f"is cut short inside its header ({start - 5} bytes, the header alone needs {start})" in \
        safetensors_problem(tmp_path / "b.safetensors")
    (tmp_path / "c.safetensors").write_bytes(b"\x01\x02\x03")
    assert "is 3 bytes, too short for a safetensors header" in safetensors_problem(tmp_path / "c.safetensors")
    (tmp_path / "d.safetensors").write_bytes(b"not a safetensors file at all")  # its length field is text
    assert "does not start with a safetensors header" in safetensors_problem(tmp_path / "d.safetensors")


def test_a_range_past_the_end_or_of_the_wrong_size_is_a_damaged_header(tmp_path):
    path = tmp_path / "model.safetensors"
    past = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [100, 116]}}  # the file holds 16 bytes
    safetensors(path, {"w": [2, 2]}, header=past)
    assert "tensor 'w' ends at byte" in safetensors_problem(path) and "(100 missing)" in safetensors_problem(path)
    wrong = {"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}  # 2x3 F32 is 24 bytes
    safetensors(path, {"w": [2, 2]}, header=wrong)
    assert "tensor 'w' is F32 [2, 3] (24 bytes) but its data_offsets span 16 bytes" in safetensors_problem(path)
    gap = {"w": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]}}
    safetensors(path, {"w": [2, 2]}, header=gap)
    assert "tensor 'w' leaves a gap of 8 bytes" in safetensors_problem(path)


def test_bytes_after_the_last_tensor_are_refused_as_safetensors_does(tmp_path):
    path = tmp_path / "model.safetensors"
    safetensors(path, TWO)
    path.write_bytes(path.read_bytes() + bytes(3))
    assert "has 3 bytes after its last tensor" in safetensors_problem(path)


def test_a_torch_zip_archive_cut_short_is_found_from_its_directory(tmp_path):
    whole = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(whole, "w") as archive:  # what torch.save writes: a zip archive
        archive.writestr("archive/data.pkl", b"x" * 100)
        archive.writestr("archive/data/0", bytes(4000))
    assert torch_bin_problem(whole) is None and weights_problem(tmp_path) is None
    whole.write_bytes(whole.read_bytes()[:3000])  # the directory at the end is gone
    assert "is a damaged or cut-short torch zip archive" in weights_problem(tmp_path)
    whole.write_bytes(b"")
    assert weights_problem(tmp_path) == f"{whole} is empty: {RECOPY} (or re-save the model)"
    whole.write_bytes(b"\x80\x02legacy pickle")  # the pre-1.6 format: not checked, left to torch
    assert weights_problem(tmp_path) is None


def index(directory, weight_map: dict):
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_every_indexed_shard_is_checked_and_must_hold_what_the_index_places_in_it(tmp_path):
    safetensors(tmp_path / "model-00001-of-00002.safetensors", {"model.embed_tokens.weight": [4, 2]})
    safetensors(tmp_path / "model-00002-of-00002.safetensors", {"lm_head.weight": [4, 2]}, cut=1)
    index(tmp_path, {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                     "lm_head.weight": "model-00002-of-00002.safetensors"})
    assert f"{tmp_path / 'model-00002-of-00002.safetensors'} is cut short" in weights_problem(tmp_path)
    safetensors(tmp_path / "model-00002-of-00002.safetensors", {"model.norm.weight": [4]})
    index(tmp_path, {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                     "lm_head.weight": "model-00002-of-00002.safetensors",
                     "model.norm.weight": "model-00002-of-00002.safetensors"})
    assert weights_problem(tmp_path) == (
        f"{tmp_path / 'model.safetensors.index.json'} places 'lm_head.weight' in model-00002-of-00002.safetensors, "
        "which does not hold it: the shards come from different exports; copy the whole checkpoint again")
    assert tensor_names(tmp_path) == ["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]


@pytest.fixture
def model_dir(tmp_path, tiny_config):
    """A checkpoint directory with the embedded tiny model's config.json and a whole weight file."""
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(tiny_config))
    safetensors(directory / "model.safetensors", TWO)
    return directory


@pytest.fixture
def tiny_config():
    from logicrl.models.tiny import TINY_CONFIG

    return TINY_CONFIG


def test_the_actor_critic_and_reward_model_weights_are_all_checked(data_files, model_dir, tmp_path, caplog):
    rm = tmp_path / "rm"
    rm.mkdir()
    (rm / "config.json").write_text(json.dumps({**json.loads((model_dir / "config.json").read_text()),
                                                "architectures": ["Qwen2ForSequenceClassification"],
                                                "num_labels": 1}))
    safetensors(rm / "model.safetensors", {"score.weight": [1, 4]}, cut=4)
    cfg, _, _ = validate(compose([*data_files, f"{ARR}.rollout.name=hf", f"{ARR}.model.path={model_dir}",
                                  "algorithm.adv_estimator=gae", "reward_model.enable=true",
                                  f"reward_model.model.path={rm}", "reward_model.model.input_tokenizer=null"]))
    # The reference shares the actor's path and the critic defaults to it: each directory once.
    assert weight_paths(cfg) == [(f"{ARR}.model.path", str(model_dir)), ("reward_model.model.path", str(rm))]
    with pytest.raises(ConfigError, match=rf"^reward_model.model.path: {rm / 'model.safetensors'} is cut short"):
        check_weights(cfg, dry_run=False)
    # A dry run loads nothing: it says so and goes on.
    check_weights(cfg, dry_run=True)
    assert "reward_model.model.path: " in caplog.text and "(a dry run plans without them" in caplog.text


def test_a_damaged_reward_model_header_is_one_line_from_validation(data_files, model_dir, tmp_path):
    rm = tmp_path / "rm"
    rm.mkdir()
    # No classifier architecture: validation reads the header for a value head (models/reward_head.py).
    (rm / "config.json").write_text((model_dir / "config.json").read_text())
    (rm / "model.safetensors").write_bytes(struct.pack("<Q", 500) + b'{"score.weight": ')
    with pytest.raises(ConfigError, match=rf"^reward_model.model.path={rm}: {rm / 'model.safetensors'} is cut short "
                                          r"inside its header \(25 bytes, the header alone needs 508\)"):
        validate(compose([*data_files, "reward_model.enable=true", f"reward_model.model.path={rm}"]))
    with pytest.raises(ValueError, match="cut short inside its header"):
        read_header(rm / "model.safetensors")


def test_the_preflight_reads_the_headers_before_anything_else(data_files, model_dir, tmp_path, monkeypatch):
    from logicrl.config.stages import Stage
    from logicrl.preflight import memory as memory_preflight
    from logicrl.preflight import preflight

    safetensors(model_dir / "model.safetensors", TWO, cut=1)
    cfg, spec, plan = validate(compose([*data_files, f"{ARR}.rollout.name=hf", f"{ARR}.model.path={model_dir}",
                                        f"trainer.default_local_dir={tmp_path / 'ckpt'}"]))
    monkeypatch.setattr(memory_preflight, "plan_for", lambda *a, **k: pytest.fail("planned before the headers"))
    with pytest.raises(ConfigError, match=rf"^{ARR}.model.path: {model_dir / 'model.safetensors'} is cut short"):
        preflight([Stage(0, "", cfg, spec, plan)])
    assert not (tmp_path / "ckpt").exists()
