"""Rollout tensor parallelism on CPU: two ranks over gloo, one vLLM engine spanning both
(tensor_model_parallel_size=2, vLLM's external_launcher; workers/rollout/vllm_tp.py).

Each rank hands the engine its OWN prompt shard (of different sizes) and must get back exactly its
own rows: greedy responses that are the HF model's argmax for its prompts, and log-probs (top-p on,
so the sampler patch is exercised under TP) that the trainer's recomputation reproduces. Then both
ranks sync the same perturbed weights (every member gets every full tensor, vLLM keeps its slice)
and the agreement holds against the perturbed model.
"""

import pytest
import torch

pytest.importorskip("vllm")

from logicrl.controller.ports import free_port  # noqa: E402
from tests.helpers.spawn import spawn  # noqa: E402

pytestmark = pytest.mark.integration

PAD = 0
SHARDS = [[[17, 250, 3, 99], [5, 6, 7, 8, 9, 10, 11]], [[42, 43]]]  # rank 0: two prompts, rank 1: one
TOP_P = dict(n=2, temperature=0.8, top_p=0.9, max_tokens=6)


def _rank(rank: int, world: int, port: int):
    from logicrl.models.loading import checkpoint_dir, load_causal_lm
    from logicrl.workers.fsdp import init_distributed
    from logicrl.workers.rollout.vllm import VLLMRolloutEngine
    from tests.workers.conftest import ask, assert_engine_logprobs_match, generate, perturbed_copy

    torch.set_num_threads(1)
    init_distributed(rank, world, "127.0.0.1", port, torch.device("cpu"))
    model_dir = str(checkpoint_dir("embedded:tiny"))
    engine = VLLMRolloutEngine(model_dir, pad_id=PAD, eos_ids=[], max_model_len=64, kv_cache_gb=0.0625,
                               max_num_seqs=8, max_num_batched_tokens=256, seed=0, tensor_model_parallel_size=2)
    assert engine.tp_group.size == 2 and engine.tp_group.rank == rank
    prompts = SHARDS[rank]
    hf = load_causal_lm(model_dir, torch.float32).eval()

    greedy = generate(engine, prompts, ask(do_sample=False, max_tokens=6))
    assert greedy.responses.shape == (len(prompts), 6)  # this rank's rows only
    for prompt, response in zip(prompts, greedy.responses):  # and they are its own prompts' answers
        ids = torch.tensor([prompt + response.tolist()])
        with torch.no_grad():
            argmax = hf(ids).logits[0, len(prompt) - 1:-1].argmax(-1)
        assert torch.equal(argmax, response)

    params = ask(seed=10 + rank, **TOP_P)  # each rank its own seed, as HybridWorker does
    assert_engine_logprobs_match(hf, prompts, generate(engine, prompts, params), params, PAD)

    actor = perturbed_copy()
    engine.sleep()
    engine.sync_weights(actor.named_parameters())
    out = generate(engine, prompts, params)
    assert_engine_logprobs_match(actor, prompts, out, params, PAD)


def test_two_ranks_share_one_tp2_engine_and_each_gets_its_own_rows():
    spawn(_rank, args=(2, free_port()), nprocs=2)
