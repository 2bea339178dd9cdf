"""Does the CPU tensor tracker's scan see the in-process vLLM engine's tensors? (docs/memory.md)

    python benchmarks/vllm_tensor_scan.py        (CPU, vLLM, the embedded tiny actor; about a minute)

Builds the rollout engine as the trainer does (workers/rollout/vllm.py: in-process, the "uni" executor)
under a PeakTracker, then compares the storages of the engine's weights, buffers and KV cache (read inside
its worker through collective_rpc) with those memory/tracker.py's live_tensor_bytes finds, and prints the
collector's freeze count: vLLM's EngineCore calls gc.freeze(), and gc.get_objects() skips frozen objects.
"""

import gc
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from logicrl.memory.tracker import PeakTracker, live_tensor_bytes
from logicrl.models.loading import checkpoint_dir
from logicrl.workers.rollout.vllm import VLLMRolloutEngine

MB = 2**20


def engine_storages(worker):
    """Runs in vLLM's worker (this process): {kind: {data_ptr: nbytes}} of the model's tensors and KV cache."""
    model = worker.get_model()

    def storages(tensors):
        return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}

    kv = []
    for ctx in worker.model_runner.compilation_config.static_forward_context.values():
        cache = getattr(ctx, "kv_cache", None)
        kv += [c for c in (cache if isinstance(cache, (list, tuple)) else [cache]) if isinstance(c, torch.Tensor)]
    return os.getpid(), {"weights": storages(model.parameters()), "buffers": storages(model.buffers()),
                         "KV cache": storages(kv)}


def scanned_ptrs() -> set[int]:
    return {o.untyped_storage().data_ptr() for o in gc.get_objects()
            if isinstance(o, torch.Tensor) and o.device.type == "cpu"}


def main() -> None:
    with PeakTracker("cpu") as tracker:
        engine = VLLMRolloutEngine(str(checkpoint_dir("embedded:tiny")), pad_id=0, eos_ids=[], max_model_len=320,
                                   kv_cache_gb=0.0625, max_num_seqs=16, max_num_batched_tokens=512, seed=0)
    pid, kinds = engine.llm.collective_rpc(engine_storages)[0]
    print(f"engine in this process: {pid == os.getpid()} (VLLM_ENABLE_V1_MULTIPROCESSING="
          f"{os.environ.get('VLLM_ENABLE_V1_MULTIPROCESSING')}); frozen objects: {gc.get_freeze_count()}")
    print(f"while building: tracker peak {tracker.peak_bytes / MB:.2f} MB; after: live_tensor_bytes "
          f"{live_tensor_bytes() / MB:.2f} MB")
    seen = scanned_ptrs()
    for kind, ptrs in kinds.items():
        found = sum(n for p, n in ptrs.items() if p in seen)
        print(f"{kind}: {len(ptrs)} storages, {sum(ptrs.values()) / MB:.2f} MB; found by the scan {found / MB:.2f} MB")


if __name__ == "__main__":
    main()
