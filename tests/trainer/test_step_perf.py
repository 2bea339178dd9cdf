"""Where the step's time goes: the FLOP formula, MFU, throughput and tail metrics, by hand."""

import pytest

from logicrl.models.spec import ModelSpec
from logicrl.trainer.step_perf import (
    FlopModel,
    generation_metrics,
    mfu_metrics,
    peak_bf16_flops,
    phase_shares,
    trainer_metrics,
)

# One layer, hidden 4, 2 heads x 2 (1 kv head), MLP 8, vocab 10. Linears [out, in]: q 4x4=16, k 2x4=8,
# v 8, o 16, gate 8x4=32, up 32, down 4x8=32 -> 144; lm_head 10x4=40 -> N = 184. Attention width 4.
SPEC = ModelSpec(name="t", model_type="llama", num_layers=1, hidden_size=4, num_heads=2, num_kv_heads=1,
                 head_dim=2, intermediate_size=8, vocab_size=10, max_position_embeddings=64,
                 tie_word_embeddings=False, attention_bias=False)
LENGTHS = [3, 1]  # T = 4 tokens, sum L^2 = 10 -> A = 2 x 1 layer x 4 x 10 = 80


def test_full_fine_tuning_flops():
    f = FlopModel.of(SPEC)
    assert (f.matmul_params, f.lora_params, f.attention(LENGTHS)) == (184, 0, 80)
    assert f.forward(LENGTHS) == 2 * 184 * 4 + 80 == 1552
    # 6NT + 3A; gradient checkpointing adds one forward to the hardware count only.
    assert f.update(LENGTHS, checkpointing=False) == (6 * 184 * 4 + 3 * 80, 6 * 184 * 4 + 3 * 80) == (4656, 4656)
    assert f.update(LENGTHS, checkpointing=True) == (4656, 4656 + 1552)


def test_lora_flops_count_no_weight_grads_for_the_frozen_base():
    # Rank 1 on q_proj (4+4 -> 8) and v_proj (2+4 -> 6): N_l = 14.
    f = FlopModel.of(SPEC, lora_rank=1, target_modules=["q_proj", "v_proj"])
    assert f.lora_params == 14
    assert f.forward(LENGTHS) == 2 * (184 + 14) * 4 + 80 == 1664
    # 4NT + 6 N_l T + 3A = 2944 + 336 + 240.
    assert f.update(LENGTHS, checkpointing=False) == (3520, 3520)
    assert f.update(LENGTHS, checkpointing=True) == (3520, 3520 + 1664)


def test_mfu_against_the_peak_and_none_without_one():
    f = FlopModel.of(SPEC)
    # 2 epochs x 4656 over 1 s x 2 ranks x 1e4 FLOP/s.
    m = mfu_metrics(f, LENGTHS, epochs=2, checkpointing=True, seconds=1.0, ranks=2, peak=1e4)
    assert m["perf/update_actor/mfu"] == pytest.approx(2 * 4656 / 2e4)
    assert m["perf/update_actor/hfu"] == pytest.approx(2 * 6208 / 2e4)
    assert mfu_metrics(f, LENGTHS, 2, True, 1.0, 2, peak=None) == {}


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H200", 989.4),
    ("NVIDIA GH200 480GB", 989.4), ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.1), ("NVIDIA L4", 121.0),
    ("Tesla V100-SXM2-32GB", None), (None, None),
])
def test_peak_table(name, tflops):
    peak = peak_bf16_flops(name)
    assert (peak is None and tflops is None) or peak == pytest.approx(tflops * 1e12)


def test_generation_throughput_and_tail():
    # Rank 0: 30 tokens in 3 s, rank 1: 10 in 1 s; 40 tokens over the controller's 4 s.
    m = generation_metrics([30, 10], [3.0, 1.0], 4.0, [2, 4, 6])
    assert m["perf/gen_tokens_per_s/rank0"] == m["perf/gen_tokens_per_s/rank1"] == 10.0
    assert m["perf/gen_tokens_per_s"] == 10.0
    assert m["perf/gen_rank_tail"] == 1.5  # slowest 3 s over the mean 2 s
    assert m["perf/response_length_tail"] == 1.5  # longest 6 over the mean 4


def test_trainer_tokens_per_s_counts_epochs():
    m = trainer_metrics([3, 1], {"old_log_prob": 2.0, "update_actor": 4.0}, {"update_actor": 2})
    assert m == {"perf/old_log_prob/tokens_per_s": 2.0, "perf/update_actor/tokens_per_s": 2.0}


def test_phase_shares_largest_first():
    assert phase_shares({"generate": 3.0, "reward": 0.001, "update_actor": 1.0}) == "generate 75%, update_actor 25%"
