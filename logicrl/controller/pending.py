"""A call issued to every rank and not yet waited for: the handle `call_async` / `dispatch_async` return.

The step waits (`result()`) where it needs the ranks' answers, so a phase can run on one group of ranks
while the controller goes on with another. Ray-free: the in-process group of the GPU tier (which has no
Ray) returns `Done`, a call that already ran; controller/worker_group.py returns Ray's.
"""

from __future__ import annotations

from typing import Any, Protocol


class Pending(Protocol):
    phase: str  # what a failure names: the phase, or the method called

    def ready(self) -> bool:
        """Whether every rank has answered: `result()` would not wait."""

    def result(self) -> list:
        """Each rank's result in rank order, waiting for them; a rank's failure is raised here."""


class Done:
    """A call that ran already, in this process: its results, or the error the first rank raised."""

    def __init__(self, phase: str, results: list | None = None, error: BaseException | None = None):
        self.phase, self._results, self._error = phase, results, error

    @classmethod
    def of(cls, phase: str, calls: list) -> Done:
        """Run `calls` (no-argument callables, one per rank) in rank order now; a raise is kept for `result`."""
        results: list[Any] = []
        try:
            for call in calls:
                results.append(call())
        except Exception as err:  # noqa: BLE001 -- kept and raised from result(), where the caller waits
            return cls(phase, error=err)
        return cls(phase, results)

    def ready(self) -> bool:
        return True

    def result(self) -> list:
        if self._error is not None:
            raise self._error
        return list(self._results)


def gather(*pending: Pending) -> list[list]:
    """Every call's results, in the order given: a wait for several calls issued without waiting."""
    return [p.result() for p in pending]
