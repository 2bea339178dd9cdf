"""No code from a checkpoint, said before any rank loads it: the preflight reads each DCP index and
each non-tensor shard item inertly (logicrl/checkpoint_pickles.py). A pickle naming a callable, put
into a shard item (the optimizer's lr, its place in the index moved to it, as anyone handing over a
checkpoint can do) or into the index itself, is refused in one line naming the file and the item, and
the payload never runs: its marker file stays absent. The ranks' own refusal: tests/workers/test_checkpoint_pickles.py.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from logicrl.checkpoint_layout import COMPLETE_MARKER
from logicrl.checkpoint_pickles import UnsafeCheckpoint, refuse_code
from logicrl.workers.checkpoint import save_sharded
from logicrl.workers.fsdp import build_optimizer
from tests.conftest import ROLE_DATA, TINY_RUN, assert_refused, check_main, need_data
from tests.workers.conftest import build_tiny_qwen2


class Payload:
    """What an attacker puts in: unpickling it calls os.system, which touches the marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> Path:
    """A complete global_step_1 whose actor/ is a real DCP save of a model and its AdamW state."""
    step = tmp_path_factory.mktemp("ckpt") / "global_step_1"
    model = build_tiny_qwen2(seed=0)
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, 10, 0.0, "constant")
    ids = torch.randint(0, 2048, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    save_sharded(step / "actor", model, optimizer, scheduler)
    (step / COMPLETE_MARKER).write_text("1\n")
    return step


@pytest.fixture
def step(honest, tmp_path) -> Path:
    """A copy of the honest checkpoint to tamper with."""
    import shutil

    copy = tmp_path / "ckpt" / honest.name
    shutil.copytree(honest, copy)
    return copy


def put_in_shard_item(actor: Path, payload: bytes, item: str = "param_groups.0.lr") -> tuple[Path, str]:
    """Append `payload` to the item's shard and point the index's entry for it there."""
    metadata = pickle.loads((actor / ".metadata").read_bytes())  # the test's own checkpoint: trusted here
    index = next(i for i in metadata.storage_data if i.fqn.endswith(item))
    info = metadata.storage_data[index]
    shard = actor / info.relative_path
    offset = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(payload)
    metadata.storage_data[index] = type(info)(info.relative_path, offset, len(payload))
    (actor / ".metadata").write_bytes(pickle.dumps(metadata))
    return shard, index.fqn


def test_an_honest_checkpoint_passes_with_every_plain_item_read(honest):
    # 13 non-tensor items: AdamW's param_groups (lr, betas, eps, weight_decay, amsgrad, ...) of one group.
    assert refuse_code(honest) >= 10


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_a_code_running_pickle_in_a_shard_item_is_refused_naming_file_and_item(step, tmp_path, protocol):
    marker = tmp_path / "ran"
    shard, fqn = put_in_shard_item(step / "actor", pickle.dumps(Payload(marker), protocol=protocol))
    with pytest.raises(UnsafeCheckpoint) as refused:
        refuse_code(step)
    line = str(refused.value)
    assert line.startswith(f"checkpoint file {shard}, item {fqn}: a pickle that is not plain data (it names "
                           f"{os.name}.system)"), line
    assert "\n" not in line and "trainer.resume_mode=disable" in line
    assert not marker.exists()


def test_a_tensor_or_older_format_item_of_plain_values_passes(step):
    # A tensor-valued lr (torch.save's zip with a storage) and a bare pickle of a float: what torch may write.
    import io

    buffer = io.BytesIO()
    torch.save(torch.tensor(1e-3), buffer)
    put_in_shard_item(step / "actor", buffer.getvalue())
    put_in_shard_item(step / "actor", pickle.dumps(0.9), item="param_groups.0.eps")
    assert refuse_code(step) >= 10


def test_a_code_running_pickle_in_the_index_is_refused(step, tmp_path):
    marker = tmp_path / "ran"
    (step / "actor" / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(UnsafeCheckpoint) as refused:
        refuse_code(step)
    assert str(refused.value).startswith(f"checkpoint file {step / 'actor' / '.metadata'}, item the DCP index: a "
                                         f"pickle that is not plain data (it names {os.name}.system)")
    assert not marker.exists()


def test_a_damaged_item_is_left_to_the_manifest_check(step):
    """Damage (the CRC's to find: the trainer sets the checkpoint aside) is not a refusal here, but a
    damaged pickle is still read far enough to refuse a global it names before the damage."""
    put_in_shard_item(step / "actor", pickle.dumps([1.0, 2.0])[:-4])
    assert refuse_code(step) >= 10
    cut = pickle.dumps([os.system, 1.0])[:-3]
    put_in_shard_item(step / "actor", cut, item="param_groups.0.eps")
    with pytest.raises(UnsafeCheckpoint, match=f"it names {os.name}.system"):
        refuse_code(step)


def test_the_launch_refuses_it_in_one_line_before_anything_starts(step, tmp_path):
    need_data("kk_role")
    marker = tmp_path / "ran"
    shard, fqn = put_in_shard_item(step / "actor", pickle.dumps(Payload(marker)))
    checked = check_main(*ROLE_DATA, *TINY_RUN, f"trainer.default_local_dir={step.parent}",
                         f"hydra.run.dir={tmp_path / 'run'}")
    assert_refused(checked, f"error: checkpoint file {shard}, item {fqn}: ", f"it names {os.name}.system")
    assert not marker.exists()
