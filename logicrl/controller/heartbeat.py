"""Heartbeats from the ranks to the driver: a rank that stops (kill -STOP, a debugger, a call stuck outside
Python holding the GIL) ends the run in bounded time, whatever the number of ranks.

Collective timeouts alone do not: a rank waiting on a stopped peer times out, but a run of one rank has no
peer, and Ray sees a stopped process as alive. So each rank runs a thread that bumps a counter in the
cluster's key-value store (the GCS: it works across nodes, no shared file system needed) every BEAT_S, and
the driver, while it waits on the ranks (controller/worker_group.py), reads the counters; a rank whose
counter has not moved for `bound_s` (trainer.collective_timeout_s: as long as a collective may wait) is
named, and the run ends (stop_ray kills its process: SIGKILL reaches a stopped one). Time is the driver's
own clock, so nodes' clocks need not agree; a rank is watched from its first beat (its start-up is
`WorkerGroup`'s to bound).
"""

from __future__ import annotations

import threading
import time

from ray.experimental import internal_kv

NAMESPACE = "logicrl_heartbeat"
BEAT_S = 1.0
# The driver's reads and deletes give up after this: without a bound, a GCS that died between two of the GCS
# watch's polls held the controller in the call (Ray's client waits 60 s for it), and the run ended only by the
# watch's last resort after its grace period.
KV_TIMEOUT_S = 2.0


def _beat(key: bytes) -> None:
    count = 0
    while True:
        count += 1
        try:
            internal_kv._internal_kv_put(key, str(count).encode(), overwrite=True, namespace=NAMESPACE)
        except Exception:  # noqa: BLE001 - a lost GCS is the driver's to report (controller/cluster.py)
            pass
        time.sleep(BEAT_S)


def beating(worker_cls: type) -> type:
    """`worker_cls` whose instances, once placed in their process, beat under `heartbeat_key` (a keyword
    argument the driver adds) from the first line of their constructor (model loading included)."""

    class Beating(worker_cls):
        def __init__(self, *args, heartbeat_key: str, **kwargs):
            threading.Thread(target=_beat, args=(heartbeat_key.encode(),), daemon=True,
                             name="logicrl-heartbeat").start()
            super().__init__(*args, **kwargs)

    # Ray names the rank's process after the class (ray::HybridWorker), as users and tests look for it.
    Beating.__name__ = Beating.__qualname__ = worker_cls.__name__
    return Beating


class HeartbeatWatch:
    """The driver's side: the ranks' counters, read at most every BEAT_S."""

    def __init__(self, keys: list[str], bound_s: float):
        self.keys, self.bound_s = [k.encode() for k in keys], bound_s
        self.seen: dict[int, tuple[bytes, float]] = {}  # rank -> (its counter, when it last changed)
        self.read_at = 0.0

    def silent(self) -> tuple[int, float] | None:
        """(rank, seconds) of a rank whose counter has not moved for longer than bound_s, or None."""
        now = time.monotonic()
        if now - self.read_at < BEAT_S:
            return None
        self.read_at = now
        for rank, value in enumerate(self._read()):
            if value is None:
                continue  # not started yet
            last = self.seen.get(rank)
            if last is None or last[0] != value:
                self.seen[rank] = (value, now)
            elif now - last[1] > self.bound_s:
                return rank, now - last[1]
        return None

    def _read(self) -> list[bytes | None]:
        try:
            found = internal_kv.internal_kv_get_gcs_client().internal_kv_multi_get(
                self.keys, NAMESPACE.encode(), timeout=KV_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - a GCS that does not answer: its watch names the loss (cluster.py)
            return [None] * len(self.keys)
        return [found.get(k) for k in self.keys]

    def forget(self) -> None:
        client = internal_kv.internal_kv_get_gcs_client()
        for key in self.keys:
            try:
                client.internal_kv_del(key, False, NAMESPACE.encode(), timeout=KV_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the cluster is going away with them
                pass
