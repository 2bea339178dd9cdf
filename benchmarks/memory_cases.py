"""The three out-of-memory cases of docs/memory.md, planned from the shape configs in logicrl/memory/shapes/.

    .venv/bin/python benchmarks/memory_cases.py > /tmp/cases.md     # the tables of docs/memory.md

For each case: the plan of the configuration as a user would first write it, the refusal the
preflight gives, and the settings `settle` reaches by applying what the planner proposes, one
change at a time (auto_micro_batch first, then the remedy check_fit names), until every phase fits.
"""

from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a script, not part of the package: find logicrl from any directory

from logicrl.config import ConfigError, compose, validate
from logicrl.config.models import model
from logicrl.config.phases import ARR
from logicrl.memory.fit import _flag_knobs, auto_micro_batch, check_fit, remedies, worst_phase
from logicrl.memory.phases import GB
from logicrl.memory.planner import COMPONENTS, HEADROOM_GB, MemoryPlan, plan_inputs
from logicrl.memory.planner_inputs import KNOBS, PlanInputs
from logicrl.models.quant_methods import nf4_bits

SHAPES = ROOT / "logicrl" / "memory" / "shapes"

# TRL's GPTQ QLoRA run: GRPO with Qwen2.5-7B-GPTQ-int4 and QLoRA on 2 x 40 GB, vLLM at 0.2.
TRL_GPTQ_RUN = ["algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=true",
            f"{ARR}.rollout.gpu_memory_utilization=0.2",
            "data.max_prompt_length=512", "data.max_response_length=1988", f"{ARR}.rollout.n=2",
            "data.train_batch_size=2", f"{ARR}.actor.ppo_mini_batch_size=2",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=2", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=2",
            f"{ARR}.model.lora_rank=16", f"{ARR}.model.lora_alpha=32",
            f"{ARR}.model.enable_gradient_checkpointing=true",
            "trainer.dry_run=true"]


@dataclass
class Case:
    title: str
    shape: str
    gpus: int
    gpu_gb: float
    overrides: list[str]
    what_if: dict = field(default_factory=dict)
    note: str = ""
    # A shape in SHAPES scored as a one-label classifier by the reward_model group (reward_model.enable=true):
    # its config.json, architecture renamed, is written beside the data (reward_classifier).
    reward_model: str | None = None


def _common(shape: str, gpus: int, gpu_gb: float) -> list[str]:
    return [f"{ARR}.model.path={SHAPES / shape}", f"trainer.n_gpus={gpus}", f"trainer.gpu_memory_gb={gpu_gb}",
            "trainer.device=cuda", f"{ARR}.rollout.name=vllm"]


# Gradient checkpointing off, as each case's first try: the refusals name it (verl's default turns it on).
NO_CKPT = [f"{ARR}.model.enable_gradient_checkpointing=false", "critic.model.enable_gradient_checkpointing=false"]
# The rollout.n 32 and 64 runs differ only in n.
QWEN7B_GRPO = [*NO_CKPT, "algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=true", "data.max_prompt_length=512",
               "data.max_response_length=4096", "data.train_batch_size=8", f"{ARR}.actor.ppo_mini_batch_size=4",
               f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=16",
               f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=16", f"{ARR}.rollout.gpu_memory_utilization=0.6"]

CASES = [
    Case("PPO on Llama-3-8B: actor, critic, reference and reward model on 4 x 48 GB, 1024-token prompts",
         "llama-3.1-8b", 4, 48,
         [*NO_CKPT, "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "data.max_prompt_length=1024",
          "data.max_response_length=1024", "data.train_batch_size=64", f"{ARR}.rollout.n=1",
          f"{ARR}.actor.ppo_mini_batch_size=16", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
          "critic.ppo_micro_batch_size_per_gpu=4", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=16",
          f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=16", f"{ARR}.rollout.gpu_memory_utilization=0.4",
          "reward_model.enable=true", "reward_model.model.input_tokenizer=null",
          "reward_model.micro_batch_size_per_gpu=16"],
         reward_model="llama-3.1-8b",
         note="The reward model is the reward_model group's (`reward_model.enable=true`, `reward_model.model.path` a "
              "Llama-3.1-8B one-label classifier: the shape's config.json as `LlamaForSequenceClassification`, no "
              "weights), frozen and held like the reference (sharded, resharded after its forward). It shares the "
              "actor's tokenizer (`input_tokenizer=null`), so it scores the actor's 2048-token rows as they are, "
              "split by `reward_model.micro_batch_size_per_gpu` (the reward_model row)."),
    Case("GRPO on Qwen2.5-7B, 4 x 80 GB, train_batch_size 8, rollout.n 32", "qwen2.5-7b", 4, 80,
         [*QWEN7B_GRPO, f"{ARR}.rollout.n=32"]),
    Case("The same at rollout.n 64", "qwen2.5-7b", 4, 80, [*QWEN7B_GRPO, f"{ARR}.rollout.n=64"]),
    Case("GRPO with a 4-bit Qwen2.5-7B, LoRA and vLLM on 2 x 40 GB", "qwen2.5-7b", 2, 40,
         [*NO_CKPT, "algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=true", "data.max_prompt_length=512",
          "data.max_response_length=2048", "data.train_batch_size=16", f"{ARR}.rollout.n=8",
          f"{ARR}.model.lora_rank=64", f"{ARR}.model.lora_alpha=128", f"{ARR}.actor.ppo_mini_batch_size=8",
          f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=32",
          f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=32", f"{ARR}.rollout.gpu_memory_utilization=0.5",
          f"{ARR}.model.quantization=nf4", "trainer.dry_run=true"],
         note="QLoRA on the fly (`quantization=nf4`, models/quantize.py): the frozen base's decoder Linears at "
              f"{nf4_bits(64, 256, 2):.3f} bits per weight (NF4, block 64, int8 scales double-quantised in groups "
              "of 256, torchao's layout), whole on every GPU (FSDP2 leaves them out); embeddings and lm_head in "
              "bf16, LoRA adapters and their AdamW states in fp32 and sharded, activations in bf16, plus one "
              "Linear dequantized at a time in each forward and backward. The engine loads the bf16 checkpoint "
              "and takes the dequantized base once, at build, then the adapters alone (its bf16 weights are "
              "generate's engine column). The bf16 LoRA run follows it."),
    Case("The same LoRA run in bf16 (what logicrl loads)", "qwen2.5-7b", 2, 40,
         [*NO_CKPT, "algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=true", "data.max_prompt_length=512",
          "data.max_response_length=2048", "data.train_batch_size=16", f"{ARR}.rollout.n=8",
          f"{ARR}.model.lora_rank=64", f"{ARR}.model.lora_alpha=128", f"{ARR}.actor.ppo_mini_batch_size=8",
          f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=32",
          f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=32", f"{ARR}.rollout.gpu_memory_utilization=0.5"]),
    Case("TRL's GPTQ QLoRA run: GRPO with Qwen2.5-7B-GPTQ-int4, QLoRA and vLLM at 0.2 on 2 x 40 GB",
         "qwen2.5-7b-gptq-int4", 2, 40, TRL_GPTQ_RUN,
         note="The run's settings: TRL's GRPO on two 40 GB A100s, the GPTQ int4 checkpoint (its "
              "config.json's quantization_config: 4 bits, group 128, 4.156 bits per weight with the fp16 scales and "
              "4-bit zeros), vLLM at gpu_memory_utilization 0.2 and max_model_len 2500 (512 + 1988 here), per-device "
              "batch 2, 2 generations per prompt, gradient checkpointing; LoRA rank 16 on every Linear (the run does "
              "not say; the adapters are 0.5% of the model). The engine holds the int4 checkpoint and receives only "
              "the adapters (the adapter sync). logicrl refuses to launch it (no CPU or wheel "
              "path for transformers' GPTQ loader: docs/quantization.md); the dry run plans it."),
]


def reward_classifier(shape: str, directory: Path) -> Path:
    """`shape`'s config.json as a one-label sequence classifier under `directory`: a reward model the
    reward_model group validates and plans (models/reward_head.py reads the architecture), with no weights."""
    import json

    out = directory / f"{shape}-rm"
    out.mkdir(exist_ok=True)
    config = json.loads((SHAPES / shape / "config.json").read_text())
    arch = config["architectures"][0].replace("ForCausalLM", "ForSequenceClassification")
    (out / "config.json").write_text(json.dumps({**config, "architectures": [arch], "num_labels": 1}))
    return out


def case_inputs(case: Case, data: Path) -> PlanInputs:
    rm = [f"reward_model.model.path={reward_classifier(case.reward_model, data.parent)}"] if case.reward_model else []
    cfg, spec, plan = validate(compose([*_common(case.shape, case.gpus, case.gpu_gb), f"data.train_files={data}",
                                     f"data.val_files={data}", *case.overrides, *rm]))
    return PlanInputs.from_plan(plan, cfg, spec, "cuda", **case.what_if)


def settle(x: PlanInputs, capacity: int, limit: int = 8) -> tuple[MemoryPlan, list[str]]:
    """Apply the planner's proposals until every phase fits (or nothing is left to try)."""
    changes: list[str] = []
    for _ in range(limit):
        picked = auto_micro_batch(x, capacity)
        x = x.with_micro(picked)
        changes += [f"{k}={v}" for k, v in picked.items()]
        plan = plan_inputs(x, capacity)
        if worst_phase(plan) is None:
            return plan, changes
        # After auto_micro_batch no smaller size helps, so what is left are on/off remedies.
        fixes = remedies(plan) or _best_partial(plan)
        if not fixes:
            return plan, changes
        key, value = fixes[0]
        x = _apply_flag(x, key, value)
        changes.append(f"{key}={'true' if value is True else value}")
    return plan_inputs(x, capacity), changes


def _apply_flag(x: PlanInputs, key: str, value) -> PlanInputs:
    """A remedy applied: an engine setting by its PlanInputs field, a model's switch or a micro-batch or
    budget by its key."""
    by_key = {k: f for f, k in KNOBS.items()}
    if key in by_key:
        return replace(x, **{by_key[key]: value})
    try:
        return x.switch(key, value)
    except KeyError:  # not a switch: a micro-batch or token budget
        return x.with_micro({key: value})


def _best_partial(plan: MemoryPlan) -> list[tuple[str, object]]:
    """When no single change fits the worst phase: the on/off change that lowers it most."""
    worst, x = worst_phase(plan), plan.inputs
    best = None
    for key, change in _flag_knobs(x, worst.name):
        total = plan_inputs(change(x), plan.capacity).phase(worst.name).total
        if total < worst.total and (best is None or total < best[0]):
            best = (total, key)
    return [(best[1], True)] if best else []


def markdown_table(plan: MemoryPlan) -> str:
    cap = plan.capacity / GB
    head = "| phase | " + " | ".join(COMPONENTS) + " | total GB | of capacity |"
    lines = [head, "|---|" + "---:|" * (len(COMPONENTS) + 2)]
    for p in plan.phases:
        if p.skipped:
            lines.append(f"| {p.name} | skipped: {p.skipped} |" + " |" * (len(COMPONENTS) + 1))
            continue
        cells = " | ".join(f"{p.parts[c] / GB:.2f}" for c in COMPONENTS)
        lines.append(f"| {p.name} | {cells} | **{p.total / GB:.1f}** | {100 * p.total / cap / GB:.0f}% |")
    return "\n".join(lines)


def render(case: Case, data: Path) -> str:
    x = case_inputs(case, data)
    capacity = int(case.gpu_gb * GB)
    plan = plan_inputs(x, capacity)
    rm = [f"reward_model.model.path=<{case.reward_model} as a classifier>"] if case.reward_model else []
    out = [f"### {case.title}", "", f"`{' '.join([*case.overrides, *rm])}` on {case.gpus} x {case.gpu_gb:g} GB "
           f"({HEADROOM_GB['cuda']:g} GB per GPU kept free).", ""]
    if case.note:
        out += [case.note, ""]
    out += ["As written:", "", markdown_table(plan), ""]
    try:
        check_fit(plan)
        out += ["Fits as written."]
        return "\n".join(out)
    except ConfigError as err:
        out += [f"Preflight: `error: {err}` (exit 2)", ""]
    fitted, changes = settle(x, capacity)
    if not changes:
        out += ["No micro-batch or switch the planner proposes fixes it."]
        return "\n".join(out)
    verdict = "fits" if worst_phase(fitted) is None else "still does not fit"
    out += [f"Settings the planner picks ({verdict}): `{' '.join(changes)}`", "", markdown_table(fitted), ""]
    out += [f"- {note}" for note in fitted.notes]
    if not fitted.inputs.models["actor"].ckpt:
        # The alternative a user may prefer: checkpointing buys larger micro-batches (fewer, fuller passes).
        ckpt = fitted.inputs.with_model("actor", ckpt=True).with_model("critic", ckpt=True)
        picked = auto_micro_batch(ckpt, capacity)
        peak = max(plan_inputs(ckpt.with_micro(picked), capacity).running(), key=lambda p: p.total)
        out.append(f"- With `{model('actor').ckpt_key}=true` instead, auto_micro_batch picks "
                   f"`{' '.join(f'{k}={v}' for k, v in picked.items())}` (peak: {peak.name}, "
                   f"{peak.total / GB:.1f} GB).")
    return "\n".join(out)


def cases_markdown() -> str:
    """docs/memory.md's case sections, from its first `### ` case to the end of the page
    (tests/memory/test_docs_numbers.py compares them)."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        data.write_text("".join(f'{{"prompt": "puzzle {i}"}}\n' for i in range(64)))
        return "\n\n".join(render(case, data) for case in CASES)


def summary_figures() -> dict[str, str]:
    """The figures docs/memory.md's summary ("In short") states beyond what the case tables print, as it
    prints them (tests/memory/test_docs_numbers.py checks that every GB figure there is a table's or one of
    these): what-ifs of the cases' plans."""
    from logicrl.memory.footprint import dequant_bytes
    from logicrl.memory.footprint import kv_bytes_per_token as per_token

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        data.write_text("".join(f'{{"prompt": "puzzle {i}"}}\n' for i in range(64)))
        by_title = {case.title: case for case in CASES}
        qwen = case_inputs(by_title["GRPO on Qwen2.5-7B, 4 x 80 GB, train_batch_size 8, rollout.n 32"], data)
        gptq_case = by_title["TRL's GPTQ QLoRA run: GRPO with Qwen2.5-7B-GPTQ-int4, QLoRA and vLLM at 0.2 on 2 x 40 GB"]
        gptq = case_inputs(gptq_case, data)
    capacity = int(gptq_case.gpu_gb * GB)
    from logicrl.memory.planner import build_models

    written = plan_inputs(gptq, capacity)
    # Merged: the engine holds the dequantized bf16 model and every sync streams it (no adapter sync possible).
    merged = plan_inputs(replace(gptq, engine_full_precision=True, lora_sync="merged"), capacity)
    no_ckpt = plan_inputs(gptq.with_model("actor", ckpt=False), capacity).phase("update_actor")
    kv = written.phase("generate").parts["kv_cache"]
    return {
        "7B's fp32 gradient accumulated unsharded": f"{build_models(qwen).actor.trainable_full / GB:.2f} GB",
        "7B's largest Linear dequantized from NF4": f"{dequant_bytes(qwen.spec, 2) / GB:.2f} GB",
        "GPTQ engine's bf16 weights when merged": f"{merged.phase('generate').parts['engine'] / GB:.2f} GB",
        "GPTQ merged update_weights": f"{merged.phase('update_weights').total / GB:.1f} GB",
        "GPTQ sequences in the KV cache": f"{kv // (per_token(gptq.spec, 2) * gptq.width)} sequences",
        "GPTQ update_actor activations without checkpointing": f"{no_ckpt.parts['activations'] / GB:.1f} GB",
        "GPTQ update_actor without checkpointing": f"{no_ckpt.total / GB:.1f} GB "
                                                   f"in all, {100 * no_ckpt.total / capacity:.0f}% of 40",
    }


def main() -> None:
    print(cases_markdown())


if __name__ == "__main__":
    main()
