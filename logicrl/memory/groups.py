"""update_weights on separate device groups (`actor_rollout_ref.hybrid_engine=false`): a send and a receive.

The trainer group streams its weights as a colocated rank does (the same gathers, phases.py weight_sync_phase)
but hands each bucket to the weight group's broadcast instead of an engine: rank 0 copies the bucket into one
flat byte buffer (workers/collective.py), which lives beside the bucket and the next tensor being gathered. A
rollout rank receives each bucket into a flat buffer of its size and loads views of it into its engine, which
is awake (it never sleeps: workers/rollout_worker.py); vLLM collects every adapter before it builds them, so
an adapter sync keeps all of them there. Everything else of the two groups is planner.py's, group by group.
"""

from __future__ import annotations

from logicrl.memory.engine import footprint
from logicrl.memory.footprint import FP32
from logicrl.memory.phases import Models, PhaseMemory, weight_sync_phase
from logicrl.memory.planner_inputs import PlanInputs


def payload_bytes(x: PlanInputs, m: Models) -> int:
    """Bytes one sync sends: the adapters, or every weight, in the compute dtype."""
    if x.lora_rank and x.lora_sync == "adapters":
        return m.actor.trainable_full // FP32 * x.dtype_bytes  # fp32 masters (footprint.py), sent cast
    return x.spec.num_params() * x.dtype_bytes


def flat_bucket(x: PlanInputs, m: Models) -> int:
    """The largest flat buffer of one broadcast: a bucket of update_weights_bucket_mb, or the largest tensor
    alone when it is larger, never more than the payload."""
    return min(payload_bytes(x, m), max(x.update_weights_bucket_mb * 2**20, m.actor.largest_full))


def send_phase(x: PlanInputs, m: Models, base: dict[str, int], capacity: int) -> PhaseMemory:
    """The trainer group's update_weights: the colocated stream's gathers with no engine beside them, plus
    rank 0's flat copy of the bucket it broadcasts."""
    stream = weight_sync_phase(x, m, base, capacity)
    gathered = stream.parts["params"] - base["params"]
    return _held(base, "send " + (stream.moment or "a bucket"), gathered + flat_bucket(x, m))


def receive_phase(x: PlanInputs, m: Models, base: dict[str, int], capacity: int) -> PhaseMemory:
    """The rollout group's update_weights: the engine as it generates (weights, KV cache) and the flat
    buffer being loaded; every adapter at once where the engine collects them (memory/engine.py)."""
    fp = footprint(x)
    flat = flat_bucket(x, m)
    if x.lora_rank and x.lora_sync == "adapters":
        flat = max(flat, fp.adapters_held(payload_bytes(x, m), flat))
    return _held(base, "receive a bucket", flat)


def _held(base: dict[str, int], moment: str, transient: int) -> PhaseMemory:
    phase = PhaseMemory("update_weights", moment=moment)
    phase.parts.update(base)
    phase.parts["params"] += transient
    return phase


# The phases a group plans by a footprint of its own, in place of phases.py's FOOTPRINTS entry.
GROUP_FOOTPRINTS = {
    "trainer": {"update_weights": send_phase},
    "rollout": {"update_weights": receive_phase},
}
