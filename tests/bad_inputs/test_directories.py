"""What a run writes: its directories writable, disk for a checkpoint, found before training (with
the default save_freq=-1 an unwritable directory would otherwise show only after the whole run trained).

This machine runs tests as root, for whom permission bits stop nothing: an unwritable directory
is made by a path whose parent is a regular file, or one under /proc.
The first case runs the real entry point (exit code, stderr, seconds: before the tokenizer loads);
the others run its checks in-process (`check_main`), the same code without a launch.
"""

from __future__ import annotations

import json
import shutil
from collections import namedtuple

import pytest

from logicrl.config import compose, validate
from logicrl.config.errors import ConfigError
from logicrl.config.phases import ARR
from logicrl.preflight import disk
from logicrl.preflight.memory import plan_for
from tests.bad_inputs.conftest import refused, small_run, timed_main
from tests.conftest import ROOT, assert_refused, check_main


@pytest.mark.integration
def test_a_checkpoint_directory_under_a_file_is_one_line(tmp_path):
    (tmp_path / "afile").write_text("not a directory")
    target = tmp_path / "afile" / "ckpt"
    result, seconds = timed_main(*small_run(tmp_path), f"trainer.default_local_dir={target}")
    refused(result, seconds, f"trainer.default_local_dir={target}", "is a file, not a directory", bound=10)
    assert seconds < 5  # before the tokenizer loads


def test_a_checkpoint_directory_that_cannot_be_made_is_one_line(tmp_path):
    result = check_main(*small_run(tmp_path), "trainer.default_local_dir=/proc/logicrl-ckpt")
    assert_refused(result, "trainer.default_local_dir=/proc/logicrl-ckpt", "cannot write there")


def actor_without_weights(tmp_path, tiny_dir) -> list[str]:
    model = tmp_path / "actor"
    shutil.copytree(tiny_dir, model)
    for weights in model.glob("*.safetensors"):
        weights.unlink()
    return [f"{ARR}.model.path={model}"]


def reward_model_without_weights(tmp_path, tiny_dir) -> list[str]:
    # A one-label sequence classifier passes validation on its config.json alone (no weights are read
    # there); the preflight's model check then finds it has none.
    rm = tmp_path / "rm"
    rm.mkdir()
    (rm / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForSequenceClassification"], "model_type": "qwen2", "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64,
        "intermediate_size": 128, "vocab_size": 2048, "max_position_embeddings": 8192, "id2label": {"0": "LABEL_0"}}))
    return ["reward_model.enable=true", f"reward_model.model.path={rm}"]


@pytest.mark.parametrize("bad, key", [(actor_without_weights, f"{ARR}.model.path"),
                                      (reward_model_without_weights, "reward_model.model.path")])
def test_a_refused_run_leaves_no_checkpoint_directory(tmp_path, tiny_dir, bad, key):
    # The preflight's checks create nothing (the directories are made once all passed): a run refused
    # for its model must not leave an empty trainer.default_local_dir behind.
    ckpt = tmp_path / "ckpt" / "run"
    result = check_main(*small_run(tmp_path), *bad(tmp_path, tiny_dir), f"trainer.default_local_dir={ckpt}")
    assert_refused(result, key, "has config.json but no weights")
    assert not (tmp_path / "ckpt").exists()


Usage = namedtuple("Usage", "total used free")


def config(*overrides):
    train = ROOT / "data/kk_role/train.parquet"
    return validate(compose([f"data.train_files={train}", f"data.val_files={train}", *overrides]))


def test_too_little_disk_for_one_checkpoint_is_refused(tmp_path, monkeypatch):
    cfg, spec, plan = config(f"trainer.default_local_dir={tmp_path}/ckpt")
    need = disk.checkpoint_bytes(plan_for(cfg, spec, plan)[0], cfg.trainer.save_hf_model)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * need, 9 * need, need - 1))
    with pytest.raises(ConfigError, match=rf"trainer.default_local_dir={tmp_path}/ckpt: [\d.]+ MB free, one checkpoint "
                                          r"needs about [\d.]+ MB: free disk there"):
        disk.check_directories(cfg, plan, need)
    # A tiny run's checkpoint is MBs: sizes below a GB are shown in MB, never "0.0 GB free ... needs 0.0 GB".
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * need, 0, 3_400_000))
    with pytest.raises(ConfigError, match=r": 3\.4 MB free, one checkpoint needs about 5\.0 MB"):
        disk.check_directories(cfg, plan, 5_000_000)
    assert (disk.size(0), disk.size(640_000), disk.size(11_049_000), disk.size(2.5e9)) == \
        ("0 kB", "640 kB", "11.0 MB", "2.5 GB")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 * need, 0, 2 * need))
    disk.check_directories(cfg, plan, need)  # room for one: the new one commits before the old is pruned


def test_the_checks_make_nothing_and_create_directories_makes_the_checkpoint_root(tmp_path):
    cfg, spec, plan = config(f"trainer.default_local_dir={tmp_path}/ckpt/run")
    disk.check_directories(cfg, plan, disk.checkpoint_bytes(plan_for(cfg, spec, plan)[0], cfg.trainer.save_hf_model))
    assert list(tmp_path.iterdir()) == []  # not even the probe file
    disk.create_directories(cfg)
    assert (tmp_path / "ckpt/run").is_dir()


def test_checkpoint_bytes_by_hand():
    cfg, spec, plan = config("actor_rollout_ref.rollout.name=hf")
    x = plan_for(cfg, spec, plan)[0]
    params = spec.num_params()  # the embedded model: fp32 on CPU, tied embeddings, no critic
    assert x.dtype_bytes == 4 and x.models["critic"].spec is None
    # DCP: weights + AdamW's two moments; the HF export: the weights again.
    assert disk.checkpoint_bytes(x, save_hf=True) == int((4 + 8 + 4) * params * disk.MARGIN)
    assert disk.checkpoint_bytes(x, save_hf=False) == int((4 + 8) * params * disk.MARGIN)
