"""No code from a checkpoint: a pickle that names a callable, put into a DCP shard item (the optimizer's
lr) or into the DCP index, is refused at load in one line naming the file and the item, and never runs.
In-process, one rank, no process group (DCP runs as a single rank)."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from logicrl.workers.checkpoint import UnsafeCheckpoint, _SafeFileSystemReader, load_sharded, save_sharded
from logicrl.workers.fsdp import build_optimizer
from tests.workers.conftest import build_tiny_qwen2


class Payload:
    """What an attacker appends: unpickling it calls os.system (touching the marker file)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def saved(tmp_path):
    model = build_tiny_qwen2(seed=0)
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, 10, 0.0, "constant")
    ids = torch.randint(0, 2048, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    save_sharded(tmp_path / "actor", model, optimizer, scheduler)
    return model, optimizer, scheduler, tmp_path / "actor"


def test_an_honest_checkpoint_loads_its_plain_items(saved):
    model, optimizer, scheduler, actor = saved
    for group in optimizer.param_groups:
        group["lr"] = 0.5
    load_sharded(actor, model, optimizer, scheduler)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(1e-3)  # read back through the weights-only unpickler


def test_a_pickle_in_a_shard_item_is_refused_naming_the_file_and_item_and_nothing_runs(saved, tmp_path):
    model, optimizer, scheduler, actor = saved
    marker = tmp_path / "ran"
    metadata_path = actor / ".metadata"
    metadata = pickle.loads(metadata_path.read_bytes())  # the test's own checkpoint: trusted here
    index = next(i for i in metadata.storage_data if i.fqn.endswith("param_groups.0.lr"))
    info = metadata.storage_data[index]
    shard = actor / info.relative_path
    payload = pickle.dumps(Payload(marker))
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(payload)
    metadata.storage_data[index] = type(info)(info.relative_path, offset, len(payload))
    metadata_path.write_bytes(pickle.dumps(metadata))
    with pytest.raises(UnsafeCheckpoint) as refused:
        load_sharded(actor, model, optimizer, scheduler)
    line = str(refused.value)
    assert line.startswith(f"checkpoint file {shard}, item {index.fqn}: a pickle that is not plain data")
    assert "\n" not in line and "it names posix.system" in line, line
    assert not marker.exists()


def test_a_pickle_in_the_dcp_index_is_refused_in_one_line(saved, tmp_path):
    model, optimizer, scheduler, actor = saved
    marker = tmp_path / "ran"
    (actor / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpoint) as refused:
        load_sharded(actor, model, optimizer, scheduler)
    assert str(refused.value).startswith(f"checkpoint file {actor / '.metadata'}, item the DCP index: ")
    assert not marker.exists()
    assert _SafeFileSystemReader  # the reader the index goes through
