"""vLLM's footprint (memory/engine.py) on `make train`'s model, counted by hand: between rollouts the engine
holds its weights and KV cache; its activation reserve is generate's alone; on CPU the KV cache is sized for
full-length sequences whatever lengths the plan is for."""

from dataclasses import replace

from logicrl.config.phases import ARR
from logicrl.memory.planner import plan_inputs
from tests.memory.conftest import planned

GB = 2**30
# The embedded tiny model (qwen2): 2 layers, hidden 128, 2 heads / 1 KV head of 64, MLP 352, the trained
# tokenizer's 763 tokens, tied, q/k/v biases. fp32 on CPU.
H, Q, KV, MLP, V, L = 128, 128, 64, 352, 763, 2
LAYER = H * Q + 2 * H * KV + Q * H + 3 * H * MLP + 2 * H + (Q + 2 * KV)  # Linears, two norms, q/k/v biases
WEIGHTS = 4 * (L * LAYER + V * H + H)  # + the (tied) embedding and the final norm: 467,456 parameters
assert WEIGHTS == 1_869_824
KV_PER_TOKEN = 2 * L * 1 * 64 * 4  # K and V, every layer, one KV head of 64, fp32
SEQS = 256  # rollout.max_num_seqs
# One forward of max_num_batched_tokens (8192) tokens: per token the residual and the norm's output (2 x 4H)
# and the norm's fp32 upcast (4H) beside the MLP's SiLU(gate), up and their product (3 x 4 x MLP, larger than the
# attention's 4 x 4q + 4 x width at these widths); and the sampler's two fp32 [max_num_seqs, V] buffers.
RESERVE = 8192 * (2 * 4 * H + 4 * H + 3 * 4 * MLP) + 2 * 4 * SEQS * V
assert RESERVE == 48_748_544


def test_vllm_holds_weights_and_kv_between_rollouts_and_its_reserve_only_while_generating(data):
    # 512-token prompts: 256 full sequences need more than the 64 MB floor (memory/footprint.py MIN_KV_CACHE_GB).
    *_, x = planned(*data, "data.max_prompt_length=512", f"{ARR}.rollout.name=vllm", device="cpu")
    kv = KV_PER_TOKEN * SEQS * (512 + 4)
    plan = plan_inputs(x, 16 * GB)
    for name in ("update_actor", "update_weights"):
        phase = plan.phase(name)
        assert (phase.parts["engine"], phase.parts["kv_cache"]) == (WEIGHTS, kv), name
    generate = plan.phase("generate")
    assert (generate.parts["engine"], generate.parts["kv_cache"]) == (WEIGHTS, kv)
    assert generate.parts["activations"] == RESERVE and generate.moment == "largest forward"
    # Planned for 44-token prompts (trainer.memory_plan=expected, or the closing table at a run's lengths): the
    # engine was built for full lengths, so its KV cache is the same.
    short = plan_inputs(replace(x, prompt_len=44), 16 * GB)
    assert short.phase("update_weights").parts["kv_cache"] == kv


def test_on_cuda_the_reserve_is_still_taken_from_vllms_share(data):
    *_, x = planned(*data, f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.free_cache_engine=false",
                    f"{ARR}.rollout.gpu_memory_utilization=0.5", f"{ARR}.model.dtype=float32", device="cuda")
    plan = plan_inputs(x, 16 * GB)
    generate, update = plan.phase("generate"), plan.phase("update_actor")
    # The KV cache is what is left of half the device once the weights and the reserve are counted ...
    assert generate.parts["kv_cache"] == 8 * GB - WEIGHTS - RESERVE
    assert generate.parts["engine"] + generate.parts["activations"] + generate.parts["kv_cache"] == 8 * GB
    # ... and awake but not generating (no sleep), the engine holds the weights and the KV cache alone.
    assert (update.parts["engine"], update.parts["kv_cache"]) == (WEIGHTS, 8 * GB - WEIGHTS - RESERVE)
