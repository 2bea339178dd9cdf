"""The engine/trainer gap rollout correction exists for, measured on CUDA (docs/losses.md#rollout-correction).

A Qwen2.5-0.5B-shaped model with seeded random weights samples 32 responses of 64 tokens with HF's KV-cache
decode in bf16 (the hf engine's CUDA path); the trainer then scores the same tokens with one full forward
in fp32 (logicrl's master weights) and in bf16. The control is the fp32 engine against the fp32 trainer.
The test prints one `MISMATCH {json}` line per pair (run with -s): rollout_corr/kl, the log-ppl gap, the
largest per-token gap and the share of tokens token TIS at 2.0 would truncate. It asserts only what must
hold: every number finite, and the bf16 engine further from the fp32 trainer than the fp32 engine is.

    .venv/bin/python -m pytest tests/gpu/test_mismatch_cuda.py -s
    python3 -m tests.gpu.test_mismatch_cuda      # the same without pytest's conftest (torch + transformers only)
"""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.gpu

SHAPE = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
             intermediate_size=4864, vocab_size=151936, max_position_embeddings=4096, rope_theta=1000000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=True, head_dim=64)
PROMPTS, PROMPT_LEN, NEW_TOKENS = 32, 32, 64


@pytest.fixture(scope="module")
def models():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    return build_models()


def build_models():
    import transformers

    torch.manual_seed(0)
    # A wider init than the default 0.02 makes the logits peaky, as a trained model's are (a uniform
    # distribution over 152k tokens hides every rounding difference in its flatness).
    config = transformers.Qwen2Config(**SHAPE, initializer_range=0.05)
    fp32 = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).cuda().eval()
    bf16 = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).cuda().eval()
    bf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in fp32.state_dict().items()})
    return fp32, bf16


def trainer_logprobs(model, prompts, out):
    from logicrl.models.logprob import causal_lm_logprobs

    attention_mask = torch.cat([torch.ones_like(prompts), out.response_attention_mask.to(prompts.device)], dim=1)
    ids = torch.cat([prompts, out.responses.to(prompts.device)], dim=1)
    positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return causal_lm_logprobs(model, ids, attention_mask, positions, out.responses.shape[1])[0].float()


def gap(trainer, engine, mask):
    from logicrl.algos import RolloutCorrection, apply_correction, mismatch_metrics

    metrics = {**mismatch_metrics(trainer, engine, mask),
               **apply_correction(trainer, engine, mask, RolloutCorrection(rollout_is="token")).metrics}
    out = {k.removeprefix("rollout_corr/"): float(v) for k, v in metrics.items()}
    out["max_abs_token_gap"] = float((trainer - engine).abs()[mask.bool()].max())
    out["tokens"] = int(mask.sum())
    return out


def test_bf16_engine_against_fp32_and_bf16_trainers(models):
    from logicrl.workers.rollout.base import SamplingParams
    from logicrl.workers.rollout.hf import HFRolloutEngine

    fp32, bf16 = models
    torch.backends.cuda.matmul.allow_tf32 = False  # the fp32 control must be fp32
    prompts = torch.randint(0, 2048, (PROMPTS, PROMPT_LEN), generator=torch.Generator().manual_seed(1)).cuda()
    params = SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS, seed=0)
    results = {}
    for engine_name, engine_model in (("bf16", bf16), ("fp32", fp32)):
        out = HFRolloutEngine(engine_model, pad_id=0, eos_ids=[], micro_batch_size=PROMPTS).generate(
            prompts, torch.ones_like(prompts), params)
        mask = out.response_mask.cuda()
        engine = out.log_probs.cuda().float()
        trainers = (("fp32", fp32), ("bf16", bf16)) if engine_name == "bf16" else (("fp32", fp32),)
        for trainer_name, trainer_model in trainers:
            pair = f"engine_{engine_name}_vs_trainer_{trainer_name}"
            results[pair] = gap(trainer_logprobs(trainer_model, prompts, out), engine, mask)
            print("MISMATCH", json.dumps({"pair": pair, "device": torch.cuda.get_device_name(),
                                          **{k: round(v, 6) for k, v in results[pair].items()}}))
    for pair, numbers in results.items():
        assert all(torch.isfinite(torch.tensor(v)) for v in numbers.values()), (pair, numbers)
    control, bf16_gap = results["engine_fp32_vs_trainer_fp32"], results["engine_bf16_vs_trainer_fp32"]
    assert control["max_abs_token_gap"] < bf16_gap["max_abs_token_gap"], results


if __name__ == "__main__":
    test_bf16_engine_against_fp32_and_bf16_trainers(build_models())
