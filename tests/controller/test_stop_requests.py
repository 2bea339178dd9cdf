"""Stop requests (logicrl/signals.py), with the handler called as Python would call it."""

from __future__ import annotations

import signal

import pytest

from logicrl import signals
from logicrl.signals import Stopped, requested, stop_at_step_end


def test_the_first_request_waits_for_the_step_end():
    with stop_at_step_end():
        signals._on_signal(signal.SIGUSR1, None)
        assert requested() == signal.SIGUSR1
    with pytest.raises(Stopped):  # no loop to finish a step of: at once
        signals._on_signal(signal.SIGUSR1, None)


def test_slurms_term_and_the_wrappers_usr1_are_one_request_but_a_second_term_stops_at_once(monkeypatch):
    clock = iter([100.0, 100.5, 100.0 + signals.ECHO_S + 0.1])
    monkeypatch.setattr(signals.time, "monotonic", lambda: next(clock))
    with stop_at_step_end():
        signals._on_signal(signal.SIGTERM, None)
        signals._on_signal(signal.SIGUSR1, None)  # the same request, forwarded by slurm/train.sbatch
        assert requested() == signal.SIGTERM
        with pytest.raises(Stopped) as stopped:
            signals._on_signal(signal.SIGTERM, None)
        assert stopped.value.signum == signal.SIGTERM


def test_timeouts_echo_of_the_same_signal_to_the_group_is_the_same_request(monkeypatch):
    # GNU timeout signals the command, then its whole process group (the command again).
    clock = iter([100.0, 100.0 + signals.ECHO_S / 10])
    monkeypatch.setattr(signals.time, "monotonic", lambda: next(clock))
    with stop_at_step_end():
        signals._on_signal(signal.SIGTERM, None)
        signals._on_signal(signal.SIGTERM, None)
        assert requested() == signal.SIGTERM


def test_the_other_signal_later_stops_at_once(monkeypatch):
    clock = iter([100.0, 100.0 + signals.SAME_REQUEST_S + 1])
    monkeypatch.setattr(signals.time, "monotonic", lambda: next(clock))
    with stop_at_step_end():
        signals._on_signal(signal.SIGUSR1, None)
        with pytest.raises(Stopped):
            signals._on_signal(signal.SIGTERM, None)


def test_a_stop_that_ray_reraised_as_a_plain_keyboard_interrupt_is_still_the_stop(monkeypatch):
    monkeypatch.setattr(signals, "_stopped_by", None)
    assert signals.stop_request_of(KeyboardInterrupt()) is None  # a real Ctrl-C
    with pytest.raises(Stopped):
        signals._on_signal(signal.SIGTERM, None)  # outside the loop: stops at once
    # ray.wait runs the handler inside its C++ loop and raises a new, plain KeyboardInterrupt.
    stopped = signals.stop_request_of(KeyboardInterrupt())
    assert isinstance(stopped, Stopped) and stopped.signum == signal.SIGTERM
