"""The memory planner against measurement: predicted vs measured peak per phase, on a grid.

    .venv/bin/python benchmarks/memory_plan.py [--markdown] [--csv docs/memory_plan.csv] [--json out.json]
                                                [--quick | --ranks N] [--variants ...]

For each model shape (random weights, written as a local checkpoint) the real HybridWorker is built
with every phase running (FSDP2 actor, reference and critic, a reward model of its own shape, RM_SHAPE,
the hf engine), warmed up to steady state, then for each (lengths, micro-batch) cell the trainer's
phases run in its order and each phase's peak is compared with the plan of the same config. By
default one rank on both shapes, then two ranks on the smaller one, each in VARIANTS (padded, packed,
sharded and sp on two ranks, rerender: a reward model with its own chat template, qlora: an NF4 base under
LoRA; sp: Ulysses sequence parallelism of 2 for all four models, whose SP 1 cells are packed's). About 15
minutes on 2 CPU cores; docs/memory.md explains the grid and the results. Measured: on CUDA max_memory_allocated, on
CPU the peak of live tensor bytes from c10's allocation records (logicrl/memory/tracker.py). Target:
+-15% in every cell; "rise error" checks what a phase adds to the bytes it found, a harsher test.
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

# c10 warns once per freed block it has no size for (allocated before the tracker started).
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from logicrl.config.phases import ARR

MIB = 2**20
TARGET = 0.15
QWEN2 = dict(model_type="qwen2", architectures=["Qwen2ForCausalLM"], rms_norm_eps=1e-6, rope_theta=10000.0,
             max_position_embeddings=4096, head_dim=64)
SHAPES = {
    "qwen2-s (tied, 5.7M)": dict(QWEN2, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, intermediate_size=704, vocab_size=16384,
                                  tie_word_embeddings=True),
    "qwen2-m (untied, 25M)": dict(QWEN2, hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                                   num_key_value_heads=2, intermediate_size=1024, vocab_size=24576,
                                   tie_word_embeddings=False),
}
# The reward model: its own shape (a vocabulary covering both actors' token ids), scoring the actor's rows.
RM_SHAPE = dict(QWEN2, hidden_size=192, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1,
                intermediate_size=512, vocab_size=24576, tie_word_embeddings=False)
# The sp variant's reward model: RM_SHAPE with 4 query heads (3 do not split over 2 ranks) and its one KV
# head replicated to each rank of the group (models/ulysses.py kv_replicas).
RM_SP_SHAPE = dict(RM_SHAPE, hidden_size=256, num_attention_heads=4)
SP = 2  # the sp variant's ulysses_sequence_parallel_size
RM_TEMPLATE = "{%- for m in messages %}{{- m['role'] + ': ' + m['content'] + '\n' }}{%- endfor %}"
RERENDER_LEN = 512  # reward_model.max_length of the rerender variant: >= the longest P+R, 256
LENGTHS = [(24, 40), (64, 192)]  # (prompt, response) tokens
PROMPTS, N = 4, 2  # 4 prompts x 2 responses = 8 responses per step, 2 mini-batches of 2 prompts
VARIANTS = {
    "padded": [f"{ARR}.model.use_remove_padding=false"],
    "packed": [f"{ARR}.model.use_remove_padding=true"],
    "sharded": [f"{ARR}.actor.fsdp_config.grad_accumulation=sharded", "critic.fsdp_config.grad_accumulation=sharded"],
    "rerender": [f"reward_model.max_length={RERENDER_LEN}"],  # and the reward model with its own template
    # QLoRA: an NF4 base (replicated, dequantized a Linear at a time) under rank-8 adapters (models/quantize.py)
    "qlora": [f"{ARR}.model.lora_rank=8", f"{ARR}.model.lora_alpha=16", f"{ARR}.model.quantization=nf4"],
    # Ulysses SP (models/ulysses.py): each group of SP ranks holds the same rows, each rank 1/SP of every
    # packed row's tokens; packed on 2 ranks is its SP 1.
    "sp": [f"{ARR}.model.use_remove_padding=true",  # the critic's and reward model's follow it (conf/)
           *(f"{role}.ulysses_sequence_parallel_size={SP}" for role in (f"{ARR}.actor", f"{ARR}.ref", "critic",
                                                                          "reward_model"))],
}


def write_checkpoint(shape: dict, directory: Path) -> None:
    """config.json, seeded random weights, and the embedded tiny model's tokenizer files."""
    import torch
    import transformers

    from logicrl.models.tiny import tiny_checkpoint_dir

    directory.mkdir(parents=True)
    source = tiny_checkpoint_dir()
    for f in source.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, directory / f.name)
    ids = {k: v for k, v in json.loads((source / "config.json").read_text()).items() if k.endswith("_token_id")}
    (directory / "config.json").write_text(json.dumps({**shape, **ids}))
    torch.manual_seed(0)
    config = transformers.AutoConfig.from_pretrained(directory)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(directory)


def write_reward_model(directory: Path, chat_template: str | None = None, shape: dict = RM_SHAPE) -> None:
    """A one-label Qwen2ForSequenceClassification of `shape`, seeded, with the embedded tiny model's
    tokenizer (the actors' own), under `chat_template` if given: then the worker re-renders."""
    import torch
    import transformers

    from logicrl.models.loading import load_tokenizer

    tokenizer = load_tokenizer("embedded:tiny", quiet=True)
    torch.manual_seed(0)
    config = transformers.Qwen2Config(**{k: v for k, v in shape.items() if k not in ("model_type", "architectures")},
                                      num_labels=1, pad_token_id=tokenizer.pad_token_id)
    transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(directory)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(directory)


def overrides(model_dir: Path, data: Path, prompt: int, response: int, micro: int, ranks: int,
              variant: str = "padded") -> list[str]:
    rm = model_dir.parent / {"rerender": "rm-own-template", "sp": "rm-sp"}.get(variant, "rm")
    return [*VARIANTS[variant], f"{ARR}.model.path={model_dir}", f"data.train_files={data}", f"data.val_files={data}",
            "reward_model.enable=true", f"reward_model.model.path={rm}",
            f"reward_model.micro_batch_size_per_gpu={micro}",
            "algorithm.adv_estimator=gae", f"{ARR}.actor.use_kl_loss=true", f"{ARR}.rollout.name=hf",
            f"data.max_prompt_length={prompt}", f"data.max_response_length={response}",
            f"data.train_batch_size={PROMPTS}", f"{ARR}.rollout.n={N}", f"trainer.n_gpus={ranks}",
            # Two mini-batches per step: the old-log-prob pass runs (it is skipped with one).
            f"{ARR}.actor.ppo_mini_batch_size={PROMPTS // 2}", f"{ARR}.actor.ppo_micro_batch_size_per_gpu={micro}",
            f"critic.ppo_mini_batch_size={PROMPTS // 2}", f"critic.ppo_micro_batch_size_per_gpu={micro}",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu={micro}",
            f"{ARR}.ref.log_prob_micro_batch_size_per_gpu={micro}", f"{ARR}.rollout.max_num_seqs={micro}"]


def set_micro(worker, micro: int) -> None:
    """Every phase's micro-batch to `micro`, where the worker keeps each phase's current size (from
    the step plan at start-up; the OOM recovery halves it there)."""
    for size in worker.sizes.values():
        size.value = micro


def run_phases(worker, prompts, response: int, tracker_cls, device, raw_prompt=None,
               regroup=None) -> dict[str, tuple]:
    """The trainer's phases in its order on one rank: (live bytes at the start, peak) of each.
    `raw_prompt`: the rows' prompt text, sent to the reward model only (the controller's keep=).
    `regroup`: the rows every phase after generation gets instead of this rank's own (sp_regroup)."""
    import torch
    from tensordict import NonTensorStack

    peaks: dict[str, tuple[int, int]] = {}

    def measured(name, batch=None, **kwargs):
        with tracker_cls(device) as t:
            out, _ = worker.run(batch, name, **kwargs)
        peaks[name] = (t.start_bytes, t.peak_bytes)
        if out is not None:
            batch.update(out)

    batch = prompts.clone()
    measured("generate", batch, params=dict(max_tokens=response, seed=1))
    if regroup is not None:
        batch = regroup(batch)
    if raw_prompt is not None:
        batch["raw_prompt"] = NonTensorStack.from_list(raw_prompt)
    measured("reward_model", batch)
    if raw_prompt is not None:
        del batch["raw_prompt"]
    for phase in ("old_log_prob", "ref", "values"):
        measured(phase, batch)
    g = torch.Generator().manual_seed(0)
    batch["advantages"] = torch.randn(batch["responses"].shape, generator=g) * batch["response_mask"]
    batch["returns"] = torch.randn(batch["responses"].shape, generator=g)
    for phase in ("update_critic", "update_actor"):
        measured(phase, batch)
    measured("update_weights")
    return peaks


def sp_regroup(batch, rank: int, world: int, sp: int, pad_id: int):
    """What the controller does with generated rows under Ulysses SP (trainer/ppo.py rank_shards): every
    rank's rows in one batch (cat_rounds pads their widths alike), split so that each group of `sp` ranks
    gets the same shard (trainer/batch.py group_shards). A copy, so the rank keeps its group's rows only,
    as when Ray delivers them."""
    import torch.distributed as dist

    from logicrl.trainer.batch import cat_rounds, group_shards

    parts = [None] * world
    dist.all_gather_object(parts, batch)
    return group_shards(cat_rounds(parts, pad_id), world, sp)[rank].clone()


def micros(world: int) -> list[int]:
    """One response per micro-batch (gradient accumulation), and the whole per-rank mini-batch."""
    return [1, PROMPTS // 2 * N // world]


def measure_shape(rank: int, world: int, port: int, config: dict, step_plan, shape_name: str, predicted: dict,
                  out, variant: str = "padded") -> None:
    """One rank of one shape: warm up, then every (lengths, micro) cell; rank 0 puts its rows in `out`."""
    import torch
    from tensordict import TensorDict

    from logicrl.memory.tracker import PeakTracker
    from logicrl.workers.hybrid import HybridWorker
    from tests.workers.conftest import left_padded

    # One thread per rank: on 2 shared cores OpenMP's spinning threads slow small matmuls ten-fold.
    worker = HybridWorker(config, step_plan, rank, world, "127.0.0.1", port, threads=1)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for i, (prompt, response) in enumerate([LENGTHS[0]] + LENGTHS):
        # Prompts of length P, P-1, P-2: left padding, so the padding mask every RL batch has exists.
        prompts = [torch.randint(10, 1000, (prompt - j % 3,), generator=gen).tolist() for j in range(PROMPTS)]
        ids, mask = left_padded(prompts, N, worker.engine.pad_id)  # each prompt N times, as trainer/batch.py does
        share = len(ids) // world
        rows_of_rank = slice(rank * share, (rank + 1) * share)  # trainer/batch.py: contiguous equal shards
        mine = TensorDict({"input_ids": ids[rows_of_rank], "attention_mask": mask[rows_of_rank]}, batch_size=[share])
        # Re-rendered rows: each prompt's text longer than RERENDER_LEN tokens, so every row is cut to it.
        raw = [" ".join(f"word{j}" for j in range(RERENDER_LEN)) for _ in range(share)] \
            if variant == "rerender" else None
        for micro in micros(world) if i else [1]:  # i == 0: warm-up to steady state, not reported
            set_micro(worker, micro)
            regroup = (lambda b: sp_regroup(b, rank, world, SP, worker.engine.pad_id)) if variant == "sp" else None
            measured = run_phases(worker, mine, response, PeakTracker, worker.device, raw, regroup)
            if not i:
                continue
            for phase, (begin, peak) in measured.items():
                total, moment = predicted[prompt, response, micro][phase]
                # The re-rendered reward model's rows are RERENDER_LEN wide, whatever the actor's lengths.
                width = RERENDER_LEN if variant == "rerender" and phase == "reward_model" else prompt + response
                rows.append(dict(shape=shape_name, ranks=world, variant=variant, width=width, micro=micro, phase=phase,
                                 predicted=total, measured=peak, start=begin, moment=moment,
                                 error=total / peak - 1,
                                 # The same check on what the phase adds to what it found: harsher,
                                 # since the resident weights dominate these small models' peaks.
                                 rise_error=(total - begin) / (peak - begin) - 1 if peak - begin >= MIB else None))
    if rank == 0:
        out.put(rows)
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument("--csv", type=Path, help="also write the table here, one row per cell (docs/memory_plan.csv)")
    parser.add_argument("--json", type=Path, help="also write every cell here")
    parser.add_argument("--quick", action="store_true", help="the smaller shape only, on one rank unless --ranks")
    parser.add_argument("--ranks", type=int, help="only this many FSDP ranks (default: 1 on every shape, then 2 "
                                                  "CPU processes over gloo, or 2 GPUs, on the smaller shape)")
    parser.add_argument("--variants", default="", help="comma-separated VARIANTS to run (default: all; sharded "
                                                       "and sp on two ranks only)")
    args = parser.parse_args()

    import torch

    from tests.conftest import write_jsonl

    device_kind = "cuda" if torch.cuda.is_available() else "cpu"
    capacity_gb = torch.cuda.get_device_properties(0).total_memory / 2**30 if device_kind == "cuda" else 64.0
    every, small = list(SHAPES.items()), list(SHAPES.items())[:1]
    if args.quick:
        runs = [(args.ranks or 1, small)]
    else:
        runs = [(args.ranks, every)] if args.ranks else [(1, every), (2, small)]
    chosen = [v for v in args.variants.split(",") if v]
    unknown = set(chosen) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown --variants {sorted(unknown)}: use {', '.join(VARIANTS)}")

    def variants(ranks: int) -> list[str]:  # sharded accumulation needs more than one rank to differ
        if chosen:  # SP needs its group's ranks
            return [v for v in chosen if v != "sp" or ranks % SP == 0]
        return ["padded", "packed"] + (["sharded"] if ranks > 1 else []) + ["rerender", "qlora"] + \
            (["sp"] if ranks % SP == 0 else [])
    if device_kind == "cuda":  # one GPU per rank
        runs = [(r, shapes) for r, shapes in runs if r <= torch.cuda.device_count()]
    rows, start = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = write_jsonl(Path(tmp) / "prompts.jsonl", 8)
        write_reward_model(Path(tmp) / "rm")
        write_reward_model(Path(tmp) / "rm-own-template", RM_TEMPLATE)
        write_reward_model(Path(tmp) / "rm-sp", shape=RM_SP_SHAPE)
        for ranks, shapes in runs:
            for name, shape in shapes:
                model_dir = Path(tmp) / name.split()[0]
                if not model_dir.exists():
                    write_checkpoint(shape, model_dir)
                for variant in variants(ranks):
                    rows += measure(name, ranks, variant, model_dir, data, device_kind, capacity_gb)
    report(rows, args.markdown, time.perf_counter() - start, device_kind)
    if args.csv:
        write_csv(rows, args.csv)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def measure(name: str, ranks: int, variant: str, model_dir: Path, data: Path, device_kind: str,
            capacity_gb: float) -> list[dict]:
    """Every cell of one shape on `ranks` ranks in one variant: the plans first, then the measurements."""
    import torch.multiprocessing as mp
    from omegaconf import OmegaConf

    from logicrl.config import compose, validate
    from logicrl.controller.ports import free_port
    from logicrl.memory.planner import plan_memory

    # Every plan first: composing reads conf/ and the schema, which should not change mid-run.
    predicted = {}
    for prompt, response in LENGTHS:
        for micro in micros(ranks):
            cfg, spec, step_plan = validate(compose(overrides(model_dir, data, prompt, response, micro, ranks,
                                                              variant)))
            plan = plan_memory(step_plan, cfg, spec, device=device_kind, capacity_gb=capacity_gb)
            predicted[prompt, response, micro] = {p.name: (p.total, p.moment) for p in plan.phases}
    cfg, _, step_plan = validate(compose(overrides(model_dir, data, *max(LENGTHS), 1, ranks, variant)))
    config = OmegaConf.to_container(cfg, resolve=True)
    if ranks == 1:
        queue = _List()
        measure_shape(0, 1, free_port(), config, step_plan, name, predicted, queue, variant)
    else:
        queue = mp.get_context("spawn").SimpleQueue()
        mp.spawn(measure_shape, args=(ranks, free_port(), config, step_plan, name, predicted, queue, variant),
                 nprocs=ranks)
    return queue.get()


class _List(list):
    """A one-process stand-in for the queue the ranks report through."""

    def put(self, item):
        self.append(item)

    def get(self):
        return self.pop(0)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


CSV_COLUMNS = ["model", "ranks", "variant", "P+R", "micro", "phase", "predicted MiB", "measured MiB", "error %",
               "start MiB", "rise error %"]


def write_csv(rows: list[dict], path: Path) -> None:
    """The table as docs/memory.md links it: the columns of --markdown, numbers without units."""
    import csv

    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(CSV_COLUMNS)
        for r in rows:
            rise = "" if r["rise_error"] is None else f"{100 * r['rise_error']:+.1f}"
            out.writerow([r["shape"], r["ranks"], r["variant"], r["width"], r["micro"], r["phase"],
                          f"{r['predicted'] / MIB:.1f}", f"{r['measured'] / MIB:.1f}", f"{100 * r['error']:+.1f}",
                          f"{r['start'] / MIB:.1f}", rise])


def report(rows: list[dict], markdown: bool, seconds: float, device: str) -> None:
    if markdown:
        print("| model | ranks | variant | P+R | micro | phase | predicted MiB | measured MiB | error | start MiB | "
              "rise error |")
        print("|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['shape']} | {r['ranks']} | {r['variant']} | {r['width']} | {r['micro']} | {r['phase']} | "
                  f"{r['predicted'] / MIB:.1f} | {r['measured'] / MIB:.1f} | {100 * r['error']:+.1f}% | "
                  f"{r['start'] / MIB:.1f} | "
                  f"{_pct(r['rise_error'])} |")
    else:
        print(f"{'model':<24}{'ranks':>6}{'variant':>9}{'P+R':>5}{'micro':>6}  {'phase':<15}{'predicted MiB':>14}"
              f"{'measured MiB':>14}{'error':>9}{'start MiB':>11}{'rise error':>11}")
        for r in rows:
            flag = "  MISS" if abs(r["error"]) > TARGET else ""
            print(f"{r['shape']:<24}{r['ranks']:>6}{r['variant']:>9}{r['width']:>5}{r['micro']:>6}  {r['phase']:<15}"
                  f"{r['predicted'] / MIB:>14.1f}{r['measured'] / MIB:>14.1f}{100 * r['error']:>+8.1f}%"
                  f"{r['start'] / MIB:>11.1f}{_pct(r['rise_error']):>11}{flag}")
    misses = [r for r in rows if abs(r["error"]) > TARGET]
    worst = max(rows, key=lambda r: abs(r["error"]))
    print(f"\n{len(rows)} cells on {device} in {seconds:.0f} s; {len(misses)} outside +-{100 * TARGET:.0f}%; worst "
          f"{100 * worst['error']:+.1f}% ({worst['shape']}, {worst['ranks']} rank(s), {worst['variant']}, "
          f"P+R={worst['width']}, "
          f"micro {worst['micro']}, "
          f"{worst['phase']})")
    rises = sorted(abs(r["rise_error"]) for r in rows if r["rise_error"] is not None)
    print(f"mean |error| {100 * sum(abs(r['error']) for r in rows) / len(rows):.1f}%; median |rise error| "
          f"{100 * rises[len(rises) // 2] if rises else 0:.1f}%")
    by_variant: dict[tuple, list[float]] = {}
    for r in rows:
        by_variant.setdefault((r["ranks"], r["variant"]), []).append(r["error"])
    print("worst by variant: " + ", ".join(f"{ranks} rank(s) {variant} {100 * max(errors, key=abs):+.1f}%"
                                            for (ranks, variant), errors in sorted(by_variant.items())))
    rm = [r for r in rows if r["phase"] == "reward_model"]
    if rm:
        worst_rm = max(rm, key=lambda r: abs(r["error"]))
        print(f"reward_model: {len(rm)} cells, worst {100 * worst_rm['error']:+.1f}% ({worst_rm['shape']}, "
              f"{worst_rm['ranks']} rank(s), {worst_rm['variant']}, width {worst_rm['width']}, "
              f"micro {worst_rm['micro']}), "
              f"mean |error| {100 * sum(abs(r['error']) for r in rm) / len(rm):.1f}%")


if __name__ == "__main__":
    main()
