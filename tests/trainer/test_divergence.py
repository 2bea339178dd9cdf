"""A diverged run is never hidden nor saved: non-finite metrics are written as NaN/inf and read back by
every reader, a non-finite gradient norm skips its optimizer step and is counted, the guard counts
non-finite steps in a row, and the ranks' finiteness check finds NaN/inf without false alarms.

The entry-point runs (lr=1e8, and weights made NaN by a fault) are in tests/bad_inputs/test_divergence.py.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from logicrl.config import compose
from logicrl.config.plan import Micro, Update
from logicrl.launch.sweep_summary import table, trained
from logicrl.trainer.curves import curve_points
from logicrl.trainer.divergence import (
    LR_KEYS,
    DivergenceGuard,
    diverged_line,
    learning_rates,
    nonfinite_roles,
    nonfinite_state_reason,
)
from logicrl.trainer.tracking import Tracker
from logicrl.workers.fsdp import build_optimizer, has_nonfinite, optimizer_tensors
from logicrl.workers.oom import MicroSize
from logicrl.workers.update import Trained, run_update

NAN, INF = float("nan"), float("inf")


# ---------------------------------------------------------------- the tracker and the readers
def test_nonfinite_metrics_are_written_as_nan_and_shown_on_the_console(tmp_path, capsys):
    t = Tracker(tmp_path, ["console"], 3, {}, "p", "e")
    t.log({"critic/score/mean": 0.5, "actor/pg_loss": 0.25, "actor/grad_norm": 1.5}, 1)
    t.log({"critic/score/mean": -1.0, "actor/pg_loss": NAN, "actor/grad_norm": INF, "actor/nonfinite_steps": 1,
           "note": "not a number"}, 2)
    t.close()
    out = capsys.readouterr().out
    assert "step 2: reward -1  pg_loss nan  gnorm inf" in out  # the keys stay, their values say what happened
    line = (tmp_path / "metrics.jsonl").read_text().splitlines()[1]
    assert '"actor/pg_loss": NaN' in line and '"actor/grad_norm": Infinity' in line  # Python's json spelling
    row = json.loads(line)
    assert math.isnan(row["actor/pg_loss"]) and row["actor/grad_norm"] == INF
    assert row["actor/nonfinite_steps"] == 1.0 and "note" not in row

    # Every reader of metrics.jsonl takes the NaN rows: the end-of-run curves and a sweep's summary.
    assert curve_points(tmp_path)["reward (mean score)"] == [(1, 0.5), (2, -1.0)]
    summary = trained(tmp_path)
    assert (summary["steps"], summary["reward"]) == (2, -1.0)
    assert table([{"job": "lr=1e8", "status": "failed", **summary, "detail": "diverged"}]).count("| lr=1e8 |") == 1


# ---------------------------------------------------------------- the update skips and counts
class OneWeight(torch.nn.Linear):
    """y = w * x: a model the update loop can train without FSDP2 (one rank, no process group)."""

    def __init__(self):
        super().__init__(1, 1, bias=False)
        torch.nn.init.constant_(self.weight, 0.5)

    def set_requires_gradient_sync(self, flag: bool) -> None:
        pass


def test_a_nonfinite_gradient_norm_skips_its_optimizer_step_and_is_counted():
    model = OneWeight()
    optimizer, scheduler = build_optimizer(model, lr=0.1, weight_decay=0.0, total_steps=10, warmup_ratio=0.0,
                                           schedule="constant")
    plan = Update(mini_prompts=2, per_rank_mini=2, micro=Micro("ppo_micro_batch_size_per_gpu", 2), ppo_epochs=1,
                  num_mini=2)
    role = Trained(name="actor", model=model, optimizer=optimizer, scheduler=scheduler, plan=plan,
                   loss_agg_mode="token-mean", grad_clip=1.0, world_size=1, device=torch.device("cpu"))
    # Two mini-batches of two rows: the first finite, the second with a NaN input (a bad batch under bf16).
    batch = TensorDict({"x": torch.tensor([[1.0], [2.0], [NAN], [1.0]]), "response_mask": torch.ones(4, 1)},
                       batch_size=[4])

    def loss_fn(micro, normalizer):
        return model(micro["x"]).sum() / normalizer, {}

    def retry(attempt, reset=None):
        return attempt(MicroSize("update_actor", "ppo_micro_batch_size_per_gpu", 2))

    metrics = run_update(role, batch, loss_fn, retry)
    assert metrics["actor/nonfinite_steps"] == 1.0  # a count over the step's mini-batches, not a mean
    assert math.isnan(metrics["actor/grad_norm"]) and math.isnan(metrics["actor/loss"])  # shown, not dropped
    # AdamW's first step moves w by lr against the gradient's sign (m/sqrt(v) = g/|g|): 0.5 - 0.1. The
    # skipped step leaves w, the moments and their step count as they were; nothing NaN got in.
    assert model.weight.item() == pytest.approx(0.4, abs=1e-6)
    assert optimizer.state[model.weight]["step"].item() == 1
    assert not has_nonfinite([model.weight, *optimizer_tensors(optimizer)])
    assert model.weight.grad is None  # the bad gradients are dropped, not carried into the next step
    # The schedule follows the training step (verl's), skipped optimizer step or not.
    assert scheduler.last_epoch == 1


# ---------------------------------------------------------------- the guard
def test_the_guard_counts_nonfinite_steps_in_a_row_and_a_finite_step_resets_it():
    guard = DivergenceGuard(3)
    fine = {"actor/loss": 0.1, "actor/nonfinite_steps": 0.0}
    steps = [fine, {"actor/loss": 0.2, "actor/nonfinite_steps": 1.0}, fine,  # one bad batch, then recovered
             {"actor/loss": NAN, "actor/nonfinite_steps": 0.0},  # a NaN loss alone counts too
             {"actor/loss": 0.3, "critic/loss": 0.1, "critic/nonfinite_steps": 2.0},
             {"actor/loss": INF, "actor/nonfinite_steps": 1.0}]
    reasons = [guard.observe(step, metrics) for step, metrics in enumerate(steps, start=1)]
    assert reasons[:5] == [None] * 5
    assert reasons[5] == ("3 steps in a row (4-6) had a non-finite actor and critic gradient norm or loss "
                          "(trainer.max_nonfinite_steps=3), their updates skipped")
    assert nonfinite_roles(steps[4]) == ["critic"] and nonfinite_roles(fine) == []
    assert DivergenceGuard(1).observe(7, steps[1]) == ("step 7 had a non-finite actor gradient norm or loss "
                                                       "(trainer.max_nonfinite_steps=1), their updates skipped")


def test_the_line_names_the_lr_and_the_last_checkpoint():
    lrs = {"actor": 1e8, "critic": 1e-5}
    reason = nonfinite_state_reason(["actor weights", "critic optimizer state"], 4)
    line = diverged_line(reason, ["actor", "critic"], lrs, (2, Path("/ckpt/global_step_2")), "to start a new run, ...")
    assert line == ("the run diverged: the actor weights and critic optimizer state hold NaN or inf after step 4, "
                    "which was not saved: lower actor_rollout_ref.actor.optim.lr (now 1e+08) or critic.optim.lr "
                    "(now 1e-05) and run again, which resumes it at the lower value; the last checkpoint, "
                    "/ckpt/global_step_2, is from step 2 and finite (to start a new run, ...)")
    assert diverged_line("x", ["critic"], lrs, None, "").endswith(
        "lower critic.optim.lr (now 1e-05) and run again, which resumes it at the lower value; no checkpoint was "
        "saved before it")
    # Resumed without a manifest, nothing vouches for it: not called finite, and a damaged file named as a cause.
    unverified = diverged_line(reason, ["actor"], lrs, (2, Path("/ckpt/global_step_2")), "...", unverified=True)
    assert unverified.endswith("the last checkpoint, /ckpt/global_step_2, is from step 2 and was resumed without a "
                               "MANIFEST.json to verify it against: a damaged file in it would do this too (...)")
    # Not one finite step since the resume: lowering the lr alone would diverge again from the same weights.
    again = diverged_line("3 steps in a row (3-5) had a non-finite actor gradient norm or loss", ["actor"], lrs,
                          (2, Path("/ckpt/global_step_2")), "...", resumed=True, older=Path("/ckpt/global_step_1"))
    assert again == ("the run diverged: 3 steps in a row (3-5) had a non-finite actor gradient norm or loss, and not "
                     "one step since it resumed /ckpt/global_step_2 was finite: that checkpoint's weights are likely "
                     "past saving already (finite, not sound: the lr of the steps before it), and resuming it again "
                     "would diverge again: lower actor_rollout_ref.actor.optim.lr (now 1e+08), and resume an older "
                     "checkpoint (trainer.resume_mode=/ckpt/global_step_1); or, ...")


# ---------------------------------------------------------------- the ranks' check before a save
def test_the_finiteness_check_finds_nan_and_inf_and_no_false_alarm():
    big = torch.full((4,), 3e38)  # finite, but a sum of it would overflow to inf
    assert not has_nonfinite([big, big, torch.zeros(3, dtype=torch.bfloat16)])
    assert not has_nonfinite([]) and not has_nonfinite([torch.tensor([], dtype=torch.float32)])
    assert not has_nonfinite([torch.tensor([2**40])])  # integer state (a step count) is not checked
    for bad in (NAN, INF, -INF):
        poisoned = torch.ones(5, dtype=torch.bfloat16)
        poisoned[3] = bad
        assert has_nonfinite([big, poisoned]), bad


def test_a_diverged_run_names_each_trained_roles_learning_rate():
    cfg = compose(["actor_rollout_ref.actor.optim.lr=3e-4", "critic.optim.lr=2e-5"])
    assert learning_rates(cfg) == {"actor": 3e-4, "critic": 2e-5}
    assert LR_KEYS == {"actor": "actor_rollout_ref.actor.optim.lr", "critic": "critic.optim.lr"}
    line = diverged_line("step 3 had a non-finite critic gradient norm", ["critic"], learning_rates(cfg), None, "")
    assert "lower critic.optim.lr (now 2e-05) and run again" in line
