"""A diverged run is never hidden nor saved, through the real entry point.

lr=1e8 drives the tiny model to NaN by step 3 (its first update throws the weights to ~1e8, and the
logits overflow from then on): the run stops within trainer.max_nonfinite_steps + 1 steps with one
line and exit 5, metrics.jsonl has NaN where the values were NaN, and the newest checkpoint on disk is
from before the non-finite steps, loads and is finite. The line's advice taken, the same command with a
lower lr resumes that checkpoint and trains at the lower lr (metrics.jsonl's actor/lr), saying so; its
weights, thrown to ~1e8 by the first update, still overflow, and the line now says the checkpoint is the
cause, naming the one before it. lr=1e8 leaves the weights themselves finite, so another run makes them
NaN with the `nan` fault to show that a save from them is refused.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

from logicrl.config.phases import ARR
from logicrl.run_lock import LOCK_FILE
from logicrl.trainer.checkpoint import complete_checkpoints
from tests.bad_inputs.conftest import timed_main
from tests.conftest import ROLE_DATA, TINY_RUN, read_metrics, tail

pytestmark = pytest.mark.integration

EXIT_DIVERGED = 5
LIMIT = 3
RUN = [*ROLE_DATA, *TINY_RUN, "trainer.save_freq=1", f"trainer.max_nonfinite_steps={LIMIT}"]
BOUND_S = 300  # a run of a few steps takes ~25 s on an idle 2-core machine; shared, several times that


def the_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == EXIT_DIVERGED, tail(result)
    assert len(lines) == 1 and lines[0].startswith("error: the run diverged: "), tail(result)
    return lines[0]


def finite_everywhere(checkpoint, tmp_path) -> int:
    """Load the checkpoint's sharded state (weights and AdamW's moments) and its HF export; assert every
    floating-point value is finite; return how many tensors were checked."""
    import torch
    import transformers
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    dcp_to_torch_save(checkpoint / "actor", tmp_path / "actor.pt")
    state = torch.load(tmp_path / "actor.pt", weights_only=True)
    tensors = [t for part in ("model", "optim") for t in _tensors(state[part])]
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint / "huggingface")
    tensors += list(model.state_dict().values())
    bad = [i for i, t in enumerate(tensors) if t.is_floating_point() and not torch.isfinite(t).all()]
    assert not bad, f"{len(bad)} non-finite tensors in {checkpoint}"
    return len(tensors)


def _tensors(tree):
    if hasattr(tree, "is_floating_point"):
        yield tree
    elif isinstance(tree, dict):
        for value in tree.values():
            yield from _tensors(value)


DIVERGING = [*RUN, "trainer.total_training_steps=10"]


@pytest.fixture(scope="module")
def diverged(tmp_path_factory):
    """The lr=1e8 run: (its directory, holding ckpt/ and run/, the result, its seconds)."""
    base = tmp_path_factory.mktemp("diverged")
    result, seconds = timed_main(*DIVERGING, f"{ARR}.actor.optim.lr=1e8", f"trainer.default_local_dir={base / 'ckpt'}",
                                 f"hydra.run.dir={base / 'run'}", fresh=False)
    return base, result, seconds


def test_a_run_driven_to_nan_stops_shows_the_nan_and_keeps_a_finite_checkpoint(diverged, tmp_path):
    base, result, seconds = diverged
    ckpt = base / "ckpt"
    line = the_line(result)
    assert seconds < BOUND_S, f"{seconds:.0f} s: {line}"
    rows = read_metrics(base / "run")
    first_nan = next(r["step"] for r in rows if math.isnan(r["actor/pg_loss"]))
    last = rows[-1]["step"]
    assert last - first_nan + 1 <= LIMIT + 1 and last < 10, (first_nan, last)  # stopped, and soon
    for r in rows:
        if r["step"] >= first_nan:  # the keys stay, as NaN, and every skipped update is counted
            assert math.isnan(r["actor/grad_norm"]) and r["actor/nonfinite_steps"] == 1.0, r
        else:
            assert math.isfinite(r["actor/grad_norm"]) and r["actor/nonfinite_steps"] == 0.0, r

    # Saved every step until the first non-finite one, then held back: the newest checkpoint is from
    # before it, and it is the one the line names.
    saved = complete_checkpoints(ckpt)
    assert [step for step, _ in saved] == list(range(1, first_nan)), saved
    step, newest = saved[-1]
    assert f"{LIMIT} steps in a row ({first_nan}-{last}) had a non-finite actor gradient norm or loss" in line
    assert f"lower {ARR}.actor.optim.lr (now 1e+08)" in line
    assert f"the last checkpoint, {newest}, is from step {step} and finite" in line
    assert not [p for p in ckpt.iterdir() if ".tmp-" in p.name]
    assert finite_everywhere(newest, tmp_path) > 50


def test_the_re_run_with_a_lower_lr_resumes_at_that_lr_and_says_so(diverged, tmp_path):
    base, first, _ = diverged
    ckpt = tmp_path / "ckpt"
    shutil.copytree(base / "ckpt", ckpt)  # the first test reads the original as the first run left it
    saved = complete_checkpoints(ckpt)
    newest_step, newest = saved[-1]
    back = f"resume an older checkpoint (trainer.resume_mode={saved[-2][1]})" if len(saved) > 1 else \
        "there is no older one"
    result, seconds = timed_main(*DIVERGING, f"{ARR}.actor.optim.lr=1e-4", f"trainer.default_local_dir={ckpt}",
                                 f"hydra.run.dir={tmp_path / 'run'}", fresh=False)
    output = result.stdout + result.stderr
    assert f"{ARR}.actor.optim.lr: 1e+08 -> 0.0001 (this launch's value replaces {newest.name}'s)" in output, \
        tail(output)
    assert f"resumed from {newest} at step {newest_step}" in output
    rows = read_metrics(tmp_path / "run")
    assert rows[0]["step"] == newest_step + 1  # resumed, not started over
    assert all(r["actor/lr"] == pytest.approx(1e-4) for r in rows), [r["actor/lr"] for r in rows]
    # The weights the first run saved after its 1e8 updates overflow at any lr: the line says the checkpoint,
    # not the lr, is now the cause, and names the one before it.
    line = the_line(result)
    assert seconds < BOUND_S, f"{seconds:.0f} s: {line}"
    assert f"not one step since it resumed {newest} was finite" in line
    assert f"lower {ARR}.actor.optim.lr (now 0.0001), and {back}" in line
    assert "now 1e+08" in first.stderr and "now 1e+08" not in line


def test_weights_gone_nan_are_never_saved(tmp_path):
    ckpt = tmp_path / "ckpt"
    result, seconds = timed_main(*RUN, "trainer.total_training_steps=4", f"trainer.default_local_dir={ckpt}",
                                 f"hydra.run.dir={tmp_path / 'run'}", fault="nan@update_actor:2", fresh=False)
    line = the_line(result)
    assert seconds < BOUND_S, f"{seconds:.0f} s: {line}"
    assert "the actor weights hold NaN or inf after step 2, which was not saved" in line
    assert f"the last checkpoint, {ckpt / 'global_step_1'}, is from step 1 and finite" in line
    assert [step for step, _ in complete_checkpoints(ckpt)] == [1]
    kept = sorted(p.name for p in ckpt.iterdir() if p.name != LOCK_FILE)
    assert kept == ["global_step_1", "latest_checkpointed_iteration.txt"]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    steps = [json.loads(r)["step"] for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # the refused step is logged; nothing after it ran
