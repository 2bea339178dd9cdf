"""A real CUDA OOM, not an injected one: caught, its memory given back, the attempt retried with half.

GPU only (`make test-gpu`); skipped cleanly without CUDA. One rank: the retry goes on in place.
"""

import gc

import pytest
import torch

from logicrl.workers.oom import MicroSize, is_oom, retry_on_oom

pytestmark = pytest.mark.gpu


def test_a_real_cuda_oom_is_retried_with_half_and_its_memory_freed():
    device = torch.device("cuda")
    # retry_on_oom collects garbage: an earlier test's tensors still waiting for collection would be freed
    # inside it and read as "more freed than allocated" (H200, torch 2.11: 2.0 GB base, 68 MB after).
    gc.collect()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    unit = free // 3  # bytes per row of the pretend micro-batch: 8 and 4 rows cannot fit, 2 can
    base = torch.cuda.memory_allocated()
    size, errors = MicroSize("update_actor", "micro", 8), []

    def attempt(given: MicroSize) -> int:
        rows = given.value
        try:
            held = [torch.empty(unit, dtype=torch.uint8, device=device) for _ in range(rows)]
        except RuntimeError as err:
            errors.append((type(err), is_oom(err)))  # not the error: its traceback holds the tensors
            raise
        del held
        return rows

    assert retry_on_oom(size, attempt, device, collectives=True) == 2
    assert (size.value, size.retries) == (2, 2)
    assert errors == [(torch.OutOfMemoryError, True)] * 2
    assert torch.cuda.memory_allocated() == base  # nothing of the failed attempts is left
