"""Stop requests (logicrl/signals.py), with the handler called as Python would call it."""

from __future__ import annotations

import signal

import pytest

from logicrl import signals
from logicrl.signals import Stopped, requested, stop_at_step_end


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Each test from no request, and none left behind for this process's next test (test_gcs_watch.py's watch
    would read a stop request left here as a signal that reached the cluster)."""
    for name, value in (("_at_step_end", False), ("_requested", None), ("_requested_at", 0.0), ("_stopped_by", None)):
        monkeypatch.setattr(signals, name, value)


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


class _Forking:
    """A stand-in for what Python runs without letting it raise (logging's at-fork lock release):
    a signal handler that runs there raises into nothing."""

    def __del__(self):
        signals._on_signal(signal.SIGTERM, None)


SWALLOWED = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@SWALLOWED
def test_a_stop_swallowed_where_python_ignores_exceptions_is_raised_again(monkeypatch):
    monkeypatch.setattr(signals, "_stopped_by", None)  # put back after: a later Ctrl-C must not read as this stop
    with pytest.raises(Stopped) as stopped:
        with signals.stop_raised_again():
            _Forking()  # dropped at once: __del__ raises Stopped, Python prints it and goes on
    assert stopped.value.signum == signal.SIGTERM
    with signals.stop_raised_again():  # nothing asked to stop since: nothing raised
        pass


@SWALLOWED
def test_an_error_caused_by_a_swallowed_stop_comes_out_as_the_stop(monkeypatch):
    monkeypatch.setattr(signals, "_stopped_by", None)
    with pytest.raises(Stopped):
        with signals.stop_raised_again():
            _Forking()
            raise RuntimeError("ray.init failed half-way")
    with pytest.raises(RuntimeError):
        with signals.stop_raised_again():
            raise RuntimeError("a failure of its own")


def test_ray_init_cannot_replace_our_sigterm_handler():
    import ray._private.utils as ray_utils

    from logicrl.controller.cluster import signals_kept_while_ray_starts

    before = {signum: signal.getsignal(signum) for signum in signals.STOP_SIGNALS}
    signals.stop_on_signals()
    try:
        with signals_kept_while_ray_starts():
            ray_utils.set_sigterm_handler(lambda signum, frame: None)  # what ray.init does first
            assert signal.getsignal(signal.SIGTERM) is signals._on_signal
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
