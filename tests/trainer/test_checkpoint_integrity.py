"""Checkpoint integrity on real checkpoint files, written in-process (no process group: DCP and the
export run as one rank): every file gets a checksum as it is written, a same-size change of any
file kind is caught at resume, and a file system that refuses the save ends it with one line.

The module's fixture trains the tiny Qwen2 one step and saves global_step_1 and global_step_2 the way
the trainer does (saving -> save_sharded, export_hf, trainer_state.json -> commit); each test copies
that root and damages its copy.
"""

from __future__ import annotations

import errno
import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch

from logicrl import checksums
from logicrl.trainer import checkpoint as ckpt
from logicrl.workers.checkpoint import _SafeFileSystemReader, save_sharded
from logicrl.workers.fsdp import build_optimizer
from logicrl.workers.hf_export import export_hf, write_safetensors
from tests.workers.conftest import build_tiny_qwen2


def _save(root: Path, step: int, model, optimizer, scheduler, source: Path, fault: OSError | None = None) -> None:
    with ckpt.saving(root, step) as tmp:
        save_sharded(tmp / "actor", model, optimizer, scheduler, fault=fault)
        export_hf(model, tmp / "huggingface", str(source), dtype=torch.bfloat16)
        ckpt.write_trainer_state(tmp, ckpt.TrainerState(step=step, sampler_position=step))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(model, optimizer, scheduler, source dir, root with global_step_1 and _2)."""
    base = tmp_path_factory.mktemp("integrity")
    torch.manual_seed(0)
    model = build_tiny_qwen2(seed=0)
    source = base / "source"
    model.config.save_pretrained(source)  # what the export copies beside its weights
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, 10, 0.0, "constant")
    ids = torch.randint(0, 2048, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    scheduler.step()
    root = base / "ckpt"
    _save(root, 1, model, optimizer, scheduler, source)
    _save(root, 2, model, optimizer, scheduler, source)
    return model, optimizer, scheduler, source, root


@pytest.fixture
def root(trained, tmp_path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(trained[4], copy)
    return copy


def test_every_file_is_summed_as_written_and_only_the_controllers_json_is_read_back(trained, tmp_path, monkeypatch):
    model, optimizer, scheduler, source, _ = trained
    read_back = []
    real = ckpt.file_checksum
    monkeypatch.setattr(ckpt, "file_checksum", lambda path: read_back.append(Path(path).name) or real(path))
    _save(tmp_path, 1, model, optimizer, scheduler, source)
    files = json.loads((tmp_path / "global_step_1" / ckpt.MANIFEST_FILE).read_text())["files"]
    assert {"actor/__0_0.distcp", "actor/.metadata", "actor/lr_scheduler.json", "actor/meta.json",
            "actor/rng_rank0.json", "huggingface/model.safetensors", "huggingface/config.json",
            "trainer_state.json"} <= set(files)
    assert all(re.fullmatch(r"crc32:[0-9a-f]{8}", value) for _, value in files.values()), files
    # The writers' records are folded into the manifest and removed; the controller's own file is
    # the one read back, and it is a few hundred bytes.
    assert read_back == ["trainer_state.json"] and files["trainer_state.json"][0] < 4096
    assert not list((tmp_path / "global_step_1").rglob(".checksums-*"))
    for rel, (_, value) in files.items():  # and what was summed on the way is what is on disk
        assert checksums.file_checksum(tmp_path / "global_step_1" / rel) == value, rel


def _item_range(actor: Path, prefix: str) -> tuple[int, int]:
    """Byte range in __0_0.distcp of the first DCP item whose name starts with `prefix`."""
    metadata = _SafeFileSystemReader(actor).read_metadata()
    for index, info in metadata.storage_data.items():
        if index.fqn.startswith(prefix):
            return info.offset, info.length
    raise AssertionError(f"no {prefix} item in {actor}")


def _overwrite(path: Path, start: int, length: int) -> None:
    """A same-size corruption: `length` bytes from `start` inverted, the size unchanged."""
    data = bytearray(path.read_bytes())
    size = len(data)
    data[start:start + length] = bytes(b ^ 0xFF for b in data[start:start + length])
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size


# Each file kind a checkpoint holds, and where in it the damage goes.
KINDS = {
    "sharded weights": ("actor/__0_0.distcp", lambda step: _item_range(step / "actor", "model.")),
    "optimizer state": ("actor/__0_0.distcp", lambda step: _item_range(step / "actor", "optim.state.")),
    "DCP index": ("actor/.metadata", None),
    "lr scheduler": ("actor/lr_scheduler.json", None),
    "HF export": ("huggingface/model.safetensors", None),
    "trainer state": ("trainer_state.json", None),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_same_size_change_of_each_file_kind_is_caught_at_resume(root, kind, caplog):
    rel, where = KINDS[kind]
    newest = root / "global_step_2"
    path = newest / rel
    start, length = where(newest) if where else (path.stat().st_size // 2, 1)
    _overwrite(path, start + length // 2, min(length, 64))
    assert ckpt.damage(newest) == f"{rel} changed since it was saved (CRC-32)"
    with caplog.at_level(logging.WARNING, logger="logicrl.trainer"):
        assert ckpt.find_resume_point(root, "auto") == root / "global_step_1"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"global_step_2 is damaged ({rel} changed since it was saved" in warnings[0]
    aside = [p for p in root.iterdir() if ".corrupt-" in p.name]
    assert [p.name.split(".corrupt-")[0] for p in aside] == ["global_step_2"] and (aside[0] / rel).is_file()
    assert ckpt.read_latest_pointer(root) == 1
    with pytest.raises(ckpt.ConfigError, match="is damaged"):  # a path asked for by name is refused, not swapped
        _overwrite(root / "global_step_1" / rel, start, 1)
        ckpt.find_resume_point(root, str(root / "global_step_1"))


def test_the_streamed_safetensors_export_loads_as_written(trained, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model, _, _, _, root = trained
    export = root / "global_step_2" / "huggingface"
    loaded = load_file(str(export / "model.safetensors"))
    weights = dict(model.named_parameters())
    assert all(torch.equal(loaded[name], weights[name].detach().to(torch.bfloat16)) for name in loaded)
    with safe_open(str(export / "model.safetensors"), "pt") as f:
        assert f.metadata() == {"format": "pt"}
    again = AutoModelForCausalLM.from_pretrained(export, torch_dtype=torch.bfloat16)
    assert torch.equal(again.model.norm.weight, model.model.norm.weight.detach().to(torch.bfloat16))
    # Odd shapes, several dtypes, a 0-d and an empty tensor: every byte range where safetensors expects it.
    tensors = {"a": torch.arange(7, dtype=torch.int64), "b": torch.randn(3, 5).half(), "c": torch.tensor(2.5),
               "d": torch.zeros(0, 4), "e": torch.tensor([True, False, True])}
    with checksums.Checksums(tmp_path, "t") as sums:
        write_safetensors(tmp_path / "x.safetensors", tensors, sums)
    back = load_file(str(tmp_path / "x.safetensors"))
    assert all(torch.equal(back[k], v) for k, v in tensors.items())
    assert checksums.recorded(tmp_path)["x.safetensors"][1] == checksums.file_checksum(tmp_path / "x.safetensors")


@pytest.mark.parametrize("code, words, fix", [(errno.ENOSPC, "No space left on device", "free disk there"),
                                              (errno.EROFS, "Read-only file system", "make it writable again")])
def test_a_full_or_read_only_disk_mid_save_is_one_line_and_keeps_the_previous_checkpoint(trained, root, code,
                                                                                          words, fix):
    # DCP's own error would be "CheckpointException ranks:dict_keys([0])"; the rank's writer raises
    # the OSError itself, naming the file (a failed write() names none; the writer adds it).
    model, optimizer, scheduler, source, _ = trained
    with pytest.raises(ckpt.SaveFailed) as failed:
        _save(root, 3, model, optimizer, scheduler, source, fault=OSError(code, words))
    line = str(failed.value)
    assert line == (f"saving global_step_3 in {root} failed: {words} (actor/__0_0.distcp): {fix} or point "
                    "trainer.default_local_dir elsewhere; global_step_2 is intact and the same command resumes "
                    "from it")
    assert isinstance(failed.value.__cause__, OSError) and failed.value.__cause__.errno == code
    assert sorted(p.name for p in root.iterdir()) == ["global_step_1", "global_step_2", ckpt.LATEST_FILE]
    assert ckpt.damage(root / "global_step_2") is None and ckpt.read_latest_pointer(root) == 2


def test_a_rank_s_disk_error_and_the_controller_s_own_are_said_the_same_way(root, monkeypatch):
    from logicrl.controller.worker_group import WorkerFailed

    # A rank's OSError reaches the controller inside the worker group's error, as its cause.
    cause = OSError(errno.ENOSPC, "No space left on device", f"{root}/global_step_3.tmp-{'0' * 32}/critic/__1_0.distcp")
    with pytest.raises(ckpt.SaveFailed, match=r"No space left on device \(critic/__1_0\.distcp\): free disk"):
        with ckpt.saving(root, 3):
            raise WorkerFailed(1, "save_checkpoint", cause, "OSError: [Errno 28] No space left on device")
    # The directory turned read-only before the save began: the controller's mkdir meets it.
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):
        if ".tmp-" in self.name:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(ckpt.SaveFailed, match=rf"saving global_step_3 in {root} failed: Permission denied "
                                              r"\(global_step_3\.tmp-[0-9a-f]+\): make it writable again"):
        with ckpt.saving(root, 3):
            pass
    monkeypatch.undo()
    # Anything else is not a disk error: it goes on as it is.
    with pytest.raises(ValueError):
        with ckpt.saving(root, 4):
            raise ValueError("a bug")
    assert [p for p in root.iterdir() if ".tmp-" in p.name] == []


def test_a_checkpoint_without_a_save_before_it_says_so(tmp_path, trained):
    model, optimizer, scheduler, source, _ = trained
    with pytest.raises(ckpt.SaveFailed, match="no checkpoint was saved before it, so the same command starts over"):
        _save(tmp_path, 1, model, optimizer, scheduler, source, fault=OSError(errno.ENOSPC, "No space left on device"))


def test_a_record_that_no_longer_matches_its_file_is_not_trusted(tmp_path):
    with checksums.Checksums(tmp_path, "rank0") as sums:
        sums.write_bytes(tmp_path / "a.bin", b"abc")
    (tmp_path / "a.bin").write_bytes(b"abcd")  # changed after its writer closed it, before the commit
    files = ckpt.manifest(tmp_path)["files"]
    assert files == {"a.bin": [4, checksums.file_checksum(tmp_path / "a.bin")]}


def test_a_checkpoint_without_a_manifest_is_said_to_be_unverified_and_checked_against_its_index(root, caplog):
    for step in (1, 2):
        (root / f"global_step_{step}" / ckpt.MANIFEST_FILE).unlink()  # older, or copied without it
    with caplog.at_level(logging.INFO, logger="logicrl"):
        assert ckpt.find_resume_point(root, "auto") == root / "global_step_2"
    assert "global_step_2 has no MANIFEST.json" in caplog.text and "its content is unverified" in caplog.text
    assert "against its MANIFEST.json" not in caplog.text  # never called verified
    # A shard cut short: its index names bytes past its end, so it is set aside without reading the shards.
    shard = next((root / "global_step_2" / "actor").glob("*.distcp"))
    size = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(size - 100)
    assert ckpt.index_damage(root / "global_step_2").startswith(f"actor/{shard.name} is {size - 100} bytes, its "
                                                                "index needs ")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="logicrl"):
        assert ckpt.find_resume_point(root, "auto") == root / "global_step_1"
    assert f"global_step_2 is damaged (actor/{shard.name} is {size - 100} bytes" in caplog.text
    aside = next(root.glob("global_step_2.corrupt-*"))
    (aside / "actor" / shard.name).unlink()  # gone: named as missing
    assert ckpt.index_damage(aside) == f"actor/{shard.name} is missing"
    (root / "global_step_1" / ckpt.STATE_FILE).write_text("{not json")
    assert ckpt.index_damage(root / "global_step_1") == f"{ckpt.STATE_FILE} does not parse"
    with pytest.raises(ckpt.ConfigError, match="trainer_state.json does not parse"):
        ckpt.find_resume_point(root, str(root / "global_step_1"))  # one named by the user is refused instead


def test_a_format_1_manifest_still_verifies(tmp_path):
    import zlib

    (tmp_path / "state.json").write_text('{"step": 3}')
    (tmp_path / "big.distcp").write_bytes(b"x" * 100)
    legacy = {"format": 1, "files": {"state.json": [11, zlib.crc32(b'{"step": 3}')], "big.distcp": [100, None]}}
    (tmp_path / ckpt.MANIFEST_FILE).write_text(json.dumps(legacy))
    assert ckpt.damage(tmp_path) is None
    (tmp_path / "big.distcp").write_bytes(b"y" * 100)  # format 1 had no checksum for it: sizes only
    assert ckpt.damage(tmp_path) is None
    (tmp_path / "state.json").write_text('{"step": 4}')
    assert ckpt.damage(tmp_path) == "state.json changed since it was saved (CRC-32)"


def test_a_damaged_checkpoint_a_curriculum_stage_starts_from_is_refused_before_it_loads(tmp_path, stage_files):
    from logicrl.trainer.curriculum import run_curriculum, write_record
    from tests.conftest import stages_of, two_stages

    root = tmp_path / "ck"
    stages = stages_of([*two_stages(stage_files), f"trainer.default_local_dir={root}"])
    final = root / "01_s1" / "global_step_3"  # stage 1 finished at its step 3
    (final / "actor").mkdir(parents=True)
    (final / "actor" / "__0_0.distcp").write_bytes(b"w" * 64)
    (final / ckpt.MANIFEST_FILE).write_text(json.dumps(ckpt.manifest(final)))
    (final / ckpt.COMPLETE_MARKER).write_text("3\n")
    write_record(root, stages, {"s1": {"final_checkpoint": str(final)}})
    _overwrite(final / "actor" / "__0_0.distcp", 10, 4)
    with pytest.raises(ckpt.ConfigError) as err:
        run_curriculum(stages, root, tmp_path / "run", carry_optimizer=False, resume=True)
    assert str(err.value) == (f"{final}, where stage 2/2 (s2) starts, is damaged (actor/__0_0.distcp changed since "
                              "it was saved (CRC-32)): restore it from a copy; or, to start a new run, give it a "
                              "directory of its own (trainer.default_local_dir=<another directory>) or move this one "
                              f"aside first: mv {root} {root}.old")


def test_a_lost_connection_during_a_save_is_not_called_a_disk_error(root):
    # ConnectionResetError is an OSError (ECONNRESET): a rank's broken link is not the file system's.
    with pytest.raises(ConnectionResetError):
        with ckpt.saving(root, 3):
            raise ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")
