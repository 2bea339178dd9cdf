"""trainer/divergence.py RejectionGuard: every token rejected for ALL_REJECTED_STEPS steps in a row ends the run."""

from types import SimpleNamespace

from logicrl.trainer.divergence import ALL_REJECTED_STEPS, REJECTED, RejectionGuard

CORR = SimpleNamespace(rollout_rs="token_k2", rollout_rs_threshold=1e-12)


def test_every_token_rejected_for_three_steps_in_a_row_ends_the_run():
    assert ALL_REJECTED_STEPS == 3
    guard = RejectionGuard(CORR)
    # Steps 1-2 all rejected, step 3 not (the streak restarts), steps 4-6 all rejected: the line at step 6.
    fractions = {1: 1.0, 2: 1.0, 3: 0.25, 4: 1.0, 5: 1.0, 6: 1.0}
    lines = {step: guard.observe(step, {REJECTED: f}) for step, f in fractions.items()}
    assert [s for s, line in lines.items() if line] == [6]
    assert lines[6] == ("steps 4-6 rejected every token (rollout_corr/rollout_rs_masked_fraction 1.0), so nothing was "
                        "trained: algorithm.rollout_correction.rollout_rs=token_k2 with rollout_rs_threshold=1e-12 "
                        "rejects everything; widen the threshold, or set rollout_rs=null")


def test_a_run_without_rejection_never_trips_it():
    guard = RejectionGuard(SimpleNamespace(rollout_rs=None, rollout_rs_threshold=None))
    assert all(guard.observe(step, {"actor/pg_loss": 0.1}) is None for step in range(1, 10))
