"""Build a model sharded from the start: no rank holds the whole model on its device, and only rank
0 holds it in host RAM (every rank's `from_pretrained` would cost a full host copy per rank).
As verl's `fsdp2_load_full_state_dict`:

  1. rank 0 reads the checkpoint into host RAM (from_pretrained: its key renames, tied embeddings,
     a fresh critic head or LoRA adapter initialised from the seed);
  2. every rank builds the same model on the meta device, shards it and allocates its own shards;
  3. `set_model_state_dict(broadcast_from_rank0=True)` broadcasts rank 0's tensors one at a time and
     each rank keeps its slice (the transient: one full tensor per rank, on the device);
  4. buffers (RoPE's inv_freq, not in the state dict) are broadcast from rank 0's model the same way.

One rank skips this, and so does a quantized base (`every_rank_loads`): its 4-bit weights are
quantized from real ones and kept whole on every rank, so each rank reads and quantizes it itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh

from logicrl.workers.fsdp import shard_model


def load_sharded_model(build: Callable[[bool], torch.nn.Module], mesh: DeviceMesh, device: torch.device,
                       param_offload: bool = False, compute_dtype: torch.dtype | None = None,
                       every_rank_loads: bool = False) -> torch.nn.Module:
    """`build(on_meta)` returns the model (read from disk, or on the meta device); shard it with
    workers/fsdp.shard_model and fill every rank's shards from rank 0's copy. A collective."""
    if every_rank_loads or not (dist.is_initialized() and dist.get_world_size() > 1):
        return shard_model(build(False), mesh, device, param_offload, compute_dtype)
    rank0 = dist.get_rank() == 0
    source = build(False) if rank0 else None  # before the meta build: the seeded inits match a plain load
    model = shard_model(build(True), mesh, device, param_offload, compute_dtype)
    # Every parameter and buffer gets real, uninitialised storage: for a parameter only this rank's
    # shard (FSDP2 moves it to the host again if offloaded), for a buffer the whole (small) tensor.
    model.to_empty(device=device)
    full = source.state_dict() if rank0 else {}  # references into `source`: no copy
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if rank0:
                buffer.copy_(source.get_buffer(name))
            dist.broadcast(buffer, src=0)
    return model
