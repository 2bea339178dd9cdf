"""workers/checkpoint.py: a checkpoint whose tensors do not fit the model (an old one, without the shape.json the
preflight compares) is one line naming it and the fix, not DCP's `CheckpointException ranks:dict_keys([0])`."""

import pytest
import torch
import torch.distributed.checkpoint as dcp

from logicrl.errors import BadInput
from logicrl.workers.checkpoint import _dcp_load


@pytest.mark.filterwarnings("ignore::UserWarning")  # DCP's "no process group: loading as one process"
@pytest.mark.parametrize("state, says", [
    ({"model": {"w": torch.zeros(4, 3)}}, "ValueError: Size mismatch between saved torch.Size([2, 3]) and current: "
                                          "torch.Size([4, 3]) for model.w"),
    ({"model": {"v": torch.zeros(2, 3)}}, "RuntimeError: Missing key in checkpoint state_dict: model.v"),
])
def test_a_checkpoint_of_another_model_is_one_line(tmp_path, state, says):
    actor = tmp_path / "global_step_1" / "actor"
    actor.mkdir(parents=True)
    dcp.save({"model": {"w": torch.zeros(2, 3)}}, checkpoint_id=str(actor))
    with pytest.raises(BadInput) as raised:
        _dcp_load(state, actor)
    line = str(raised.value)
    assert line.startswith(f"{actor} does not fit this run's model ({says}") and "it has no shape.json" in line, line
    assert line.endswith("resume it with the model (and LoRA settings) it was saved with, or start over with "
                         "trainer.resume_mode=disable")
    (tmp_path / "global_step_1" / "shape.json").write_text("{}")  # a newer checkpoint: no word on its age
    with pytest.raises(BadInput) as raised:
        _dcp_load(state, actor)
    assert "shape.json" not in str(raised.value)
