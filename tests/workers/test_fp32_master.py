"""fp32 master weights under a bf16 compute dtype, on CPU (`actor_rollout_ref.model.dtype=bfloat16`).

One worker of a one-rank run on the embedded tiny model, hf engine, Logic-RL's lr 4e-7. The actor
and critic keep fp32 weights and AdamW states and compute in bf16 (FSDP2 MixedPrecisionPolicy);
the reference and the engine hold bf16.
"""

import json

import pytest
import torch

from tests.helpers.worker import add, generate, make_worker

pytestmark = pytest.mark.integration
BF16 = ("actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.actor.optim.lr=4e-7")
U = 2.0**-8  # bf16's unit roundoff: 8 significand bits (7 stored)


def changed_fraction(worker, batch, steps: int = 3) -> float:
    """The fraction of the actor's stored weight elements that `steps` updates change at all."""
    before = worker.actor_state()
    for _ in range(steps):
        worker.run(batch, "update_actor")
    after = worker.actor_state()
    changed = sum(int((before[k] != after[k]).sum()) for k in before)
    return changed / sum(v.numel() for v in before.values())


def rollout(worker, prompts, seed: int):
    batch, _ = generate(worker, prompts, seed=seed)
    add(worker, batch, "old_log_prob")
    add(worker, batch, "ref")
    torch.manual_seed(seed)
    batch["advantages"] = torch.randn(batch["responses"].shape) * batch["response_mask"]
    return batch


@pytest.fixture(scope="module")
def bf16_worker():
    return make_worker("hf", *BF16)


def test_masters_are_fp32_and_move_at_lr_4e_7_where_bf16_masters_do_not(bf16_worker, monkeypatch):
    worker, prompts = bf16_worker
    assert worker.dtype == torch.bfloat16 and worker.actor.optimizer.param_groups[0]["lr"] == 4e-7
    assert {p.dtype for p in worker.actor.model.parameters()} == {torch.float32}
    assert {p.dtype for p in worker.ref_model.parameters()} == {torch.bfloat16}
    assert {v.dtype for s in worker.actor.optimizer.state.values() for v in s.values() if v.dim()} <= {torch.float32}
    batch = rollout(worker, prompts, seed=3)
    fp32 = changed_fraction(worker, batch)
    assert {v.dtype for s in worker.actor.optimizer.state.values() for k, v in s.items() if k != "step"} \
        == {torch.float32}

    # The bug this guards against: masters stored in the compute dtype (no fp32 copy). Adam moves a
    # weight by about lr = 4e-7 a step, far below half a bf16 ulp (2^-8 |w|: 8e-5 at |w| = 0.02), so
    # almost every update rounds away. Measured: 99.997% of the fp32 masters change in 3 steps, 0.25%
    # of bf16 ones.
    import logicrl.workers.hybrid as hybrid

    monkeypatch.setattr(hybrid, "master_dtype", lambda compute: compute)
    stale, stale_prompts = make_worker("hf", *BF16)
    assert {p.dtype for p in stale.actor.model.parameters()} == {torch.bfloat16}
    bf16 = changed_fraction(stale, rollout(stale, stale_prompts, seed=3))
    assert fp32 > 0.9 and bf16 < 0.1, (fp32, bf16)


def test_checkpoint_holds_fp32_masters_and_exports_bf16(bf16_worker, tmp_path):
    from safetensors import safe_open

    from logicrl.workers.checkpoint import _SafeFileSystemReader

    worker, _ = bf16_worker
    worker.save_checkpoint(str(tmp_path), save_hf=True, merge_lora=False)
    meta = _SafeFileSystemReader(tmp_path / "actor").read_metadata().state_dict_metadata
    weights = {k: m.properties.dtype for k, m in meta.items() if k.startswith("model.")}
    moments = {k: m.properties.dtype for k, m in meta.items() if k.endswith(("exp_avg", "exp_avg_sq"))}
    assert weights and set(weights.values()) == {torch.float32}
    assert moments and set(moments.values()) == {torch.float32}
    # The HF export is written in the compute dtype, as the source's config.json declares it.
    files = list((tmp_path / "huggingface").glob("*.safetensors"))
    with safe_open(str(files[0]), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    assert json.loads((tmp_path / "huggingface" / "config.json").read_text())["model_type"] == "qwen2"


def assert_engine_agrees_within_the_bf16_bound(worker, prompts):
    """After an update and the cast-then-gather sync, the engine's log-probs of its own samples
    match the trainer's recomputation to a bound derived from bf16's unit roundoff u = 2^-8.

    Both sides hold the same bf16 weights (the engine gets cast(master) from the sync, the trainer
    gathers cast(master) through FSDP2's policy), and both round every op's output to bf16; they
    differ only in how they order fp32 accumulations (a KV-cache decode step against a batched full
    forward, other shapes and padding). So an op's output may land on the neighbouring bf16 value:
    a relative difference of at most 2u per rounding. Along a token's residual stream there are
    2L + 1 such roundings that add to it (each of the L layers' attention and MLP outputs, and the
    lm_head's logits), so, adding the bounds, a logit z_v differs by at most
    2u (2L + 1) max|z|. log p_t = z_t - logsumexp(z) moves by at most 2 max_v |dz_v|, so

        |trainer - engine| <= 4u (2L + 1) max|z|      (tiny model: L = 2, i.e. 20u max|z|)

    with max|z| the largest logit magnitude of the sampled responses, measured below (the trainer's). The bound
    is worst case and loose: measured, max|z| = 11.8 gives a bound of 0.92, while the gap is at
    most 7.4e-4 (mean 6.2e-5), since most ops round identically on both sides. What it rules out
    is a gap of order one: an engine left on other weights, or fed weights cast wrongly (an
    unsynced engine after an update at lr 1e-2 is caught in fp32 by test_hybrid_worker.py).
    vLLM (CPU, bf16) measured: max 5.7e-3, mean 5.1e-4, against the same kind of bound.
    """
    batch = rollout(worker, prompts, seed=5)
    worker.run(batch, "update_actor")
    worker.run(None, "update_weights")
    batch, _ = generate(worker, prompts, seed=7)
    add(worker, batch, "old_log_prob")
    mask = batch["response_mask"].bool()
    gap = (batch["old_log_probs"] - batch["rollout_log_probs"])[mask].abs()
    with torch.no_grad():
        logits = worker.actor.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                     position_ids=batch["position_ids"]).logits.float()
    width = batch["responses"].shape[1]
    z_max = logits[:, -width - 1:-1][mask].abs().max().item()  # the logits that scored each response token
    layers = worker.actor.model.config.num_hidden_layers
    bound = 4 * U * (2 * layers + 1) * z_max
    assert gap.max().item() <= bound, (gap.max().item(), bound)
    assert gap.max().item() > 0  # bf16 on both sides: not bit-identical, so the bound is what is tested


def test_bf16_hf_engine_agrees_with_the_trainer(bf16_worker):
    assert_engine_agrees_within_the_bf16_bound(*bf16_worker)


def test_bf16_vllm_engine_agrees_with_the_trainer():
    assert_engine_agrees_within_the_bf16_bound(*make_worker("vllm", *BF16))


def test_lora_adapters_are_fp32_masters_that_compute_in_bf16():
    # No fp32 compute inside a bf16 model, and no bf16 storage for what AdamW updates.
    worker, prompts = make_worker("hf", *BF16, "actor_rollout_ref.model.lora_rank=4",
                                  "actor_rollout_ref.model.lora_alpha=8")
    params = list(worker.actor.model.parameters())
    assert {p.dtype for p in params if p.requires_grad} == {torch.float32}  # the adapters
    assert {p.dtype for p in params if not p.requires_grad} == {torch.bfloat16}  # the frozen base
    lora_a = next(m for name, m in worker.actor.model.named_modules() if name.endswith("q_proj.lora_A.default"))
    seen = []
    handle = lora_a.register_forward_hook(lambda module, _, out: seen.append((module.weight.dtype, out.dtype)))
    # An update, the adapter-only sync (rollout.lora_sync=adapters: the hf engine's own peft adapters,
    # bf16), fresh samples, and the trainer's recomputation of them
    # (adapters on) within the bf16 bound; the reference pass runs the base with the adapters off.
    assert_engine_agrees_within_the_bf16_bound(worker, prompts)
    handle.remove()
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}
