"""An OOM on one rank of two (FSDP2 over gloo), without Ray: where the ranks can agree on a retry
they do, and inside FSDP2's collectives the failing rank gives up at once instead of hanging.

The entry-point test (tests/trainer/test_oom_one_rank.py) shows the rest: the driver ends the run,
saves the halved value and the re-run resumes with it. Unit cases run on one rank, no process group.
"""

import time

import pytest
import torch

from logicrl.controller.ports import free_port
from logicrl.workers.oom import MicroSize, OutOfMemoryAtMinimum, RankOutOfMemory, is_oom, retry_on_oom
from tests.helpers.spawn import spawn

PG_TIMEOUT_S = 60  # the old code's rank 1 would wait this long in its mismatched all-reduce


def _rank(rank: int, world: int, port: int, path: str):
    from logicrl.faults import Faults, parse
    from logicrl.workers.actor import forward_logprobs
    from logicrl.workers.fsdp import init_distributed, shard_model
    from logicrl.workers.oom import phase_retry
    from tests.helpers.actor_ranks import make_batch
    from tests.workers.conftest import build_tiny_qwen2, leave_group

    torch.set_num_threads(1)
    device = torch.device("cpu")
    mesh = init_distributed(rank, world, "127.0.0.1", port, device, timeout_s=PG_TIMEOUT_S)
    faults = Faults(parse("oom@generate:1@rank1,oom@old_log_prob:1@rank1"))
    record: dict = {}

    # 1. No collective inside the attempt (the hf engine's generate): rank 1's OOM is agreed on and
    # both ranks retry with half, as an OOM on every rank would.
    size = MicroSize("generate", "actor_rollout_ref.rollout.max_num_seqs", 4)
    seen = []
    got = phase_retry(size, device, faults, step=1, rank=rank)(lambda given: seen.append(given.value) or rank)
    record["generate"] = (got, seen, size.value, size.retries)

    # 2. Inside FSDP2's forward: rank 1 raises in its first decoder layer's forward while rank 0 goes
    # on into the next all-gather. Rank 1 must raise RankOutOfMemory at once, touching no collective.
    model = shard_model(build_tiny_qwen2(seed=0), mesh, device)
    batch = make_batch().chunk(world)[rank]
    size = MicroSize("old_log_prob", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 2)
    retry = phase_retry(size, device, faults, step=1, rank=rank, sharded=model)
    start = time.monotonic()
    try:
        retry(lambda given: forward_logprobs(model, batch, given, 1.0))
        record["fsdp"] = "returned"
    except RankOutOfMemory as err:
        record["fsdp"] = (type(err).__name__, err.phase, err.key, err.old, err.value, time.monotonic() - start)
    except RuntimeError as err:  # rank 0: its peer left the all-gather (gloo says so when rank 1 exits)
        record["fsdp"] = (type(err).__name__, time.monotonic() - start)
    torch.save(record, f"{path}.{rank}")
    # No barrier and no teardown: the group is broken on purpose (rank 0 waited on a peer that left),
    # and gloo's destructors in a broken group aborted rank 0 at exit now and then (SIGABRT).
    leave_group(meet=False)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("oom") / "rank")
    spawn(_rank, args=(2, free_port(), out), nprocs=2)
    return [torch.load(f"{out}.{r}") for r in range(2)]


@pytest.mark.integration
def test_an_oom_on_one_rank_without_collectives_is_retried_on_both(ranks):
    for rank, record in enumerate(ranks):
        out, seen, value, retries = record["generate"]
        assert (out, value, retries) == (rank, 2, 1)
        assert seen == [4, 2]  # the first attempt with 4 (rank 1 failed it), the retry with 2, on both ranks


@pytest.mark.integration
def test_an_oom_on_one_rank_inside_fsdp_ends_its_attempt_at_once(ranks):
    name, phase, key, old, value, seconds = ranks[1]["fsdp"]
    assert (name, phase, key, old, value) == (
        "RankOutOfMemory", "old_log_prob", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", 2, 1)
    assert seconds < 10  # not PG_TIMEOUT_S in a mismatched all-reduce
    assert ranks[0]["fsdp"][0] == "RuntimeError"  # rank 0 did not complete a collective with the failed rank


def test_cuda_oom_messages_count_as_oom():
    assert is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_oom(RuntimeError("CUDA error: out of memory\nCompile with `TORCH_USE_CUDA_DSA`"))
    assert is_oom(RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"))
    assert is_oom(RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with "
                               "NCCL_DEBUG=INFO for details), NCCL version 2.27.3\nLast error:\nCuda failure "
                               "'out of memory'"))
    assert not is_oom(RuntimeError("CUDA error: an illegal memory access was encountered"))
    assert not is_oom(ValueError("out of memory"))  # only what torch and CUDA raise


def test_a_cuda_oom_runtime_error_is_retried_with_half():
    size, calls = MicroSize("update_actor", "micro", 4), []

    def attempt(given):
        calls.append(given.value)
        if len(calls) == 1:
            raise RuntimeError("CUDA error: out of memory")
        return given.value

    assert retry_on_oom(size, attempt, torch.device("cpu"), collectives=True) == 2  # one rank: retried in place
    assert (calls, size.retries) == ([4, 2], 1)


def test_other_errors_are_not_retried():
    size = MicroSize("update_actor", "micro", 4)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        retry_on_oom(size, lambda v: (_ for _ in ()).throw(RuntimeError("an illegal memory access")),
                     torch.device("cpu"))
    assert (size.value, size.retries) == (4, 0)


def test_rank_out_of_memory_survives_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(RankOutOfMemory("update_actor", "micro", 8, 4)))
    assert (err.phase, err.key, err.old, err.value) == ("update_actor", "micro", 8, 4)
    assert str(err) == "update_actor ran out of memory inside FSDP2's collectives with micro=8; resume with micro=4"


def test_at_the_minimum_the_error_names_the_key():
    with pytest.raises(OutOfMemoryAtMinimum, match="micro=1, the smallest split"):
        MicroSize("update_actor", "micro", 1).halve()
