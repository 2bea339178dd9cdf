"""trainer.val_only's run: each checkpoint evaluated in turn, then one report across them.

    run_evaluation(runs, targets, run_dir, faults)   # main_ppo, with config/evaluation.py's runs

Each checkpoint is a PPOTrainer that only validates (its workers started and stopped as a curriculum
stage's are); a LoRA adapter is first merged over its base into run_dir/merged/<name> (peft), so every
engine loads it as a plain model. The scored samples of all checkpoints go to samples.jsonl (with a
`checkpoint` column), the metrics to eval.json, eval.md and pass_at_k.png (logicrl/eval/report.py), and
the table to the console. One checkpoint writes into run_dir itself; several, each into a sub-directory.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from omegaconf import OmegaConf, open_dict

from logicrl.config.evaluation import EvalTarget
from logicrl.config.plan import ARR
from logicrl.config.stages import Stage
from logicrl.eval.report import SAMPLES_FILE, group_metrics, write_report, write_samples
from logicrl.models.loading import checkpoint_dir, load_tokenizer
from logicrl.trainer.ppo import PPOTrainer

log = logging.getLogger("logicrl.trainer")


def _dir_name(index: int, label: str) -> str:
    return f"{index + 1:02d}_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")


def merge_adapter(adapter: Path, base: str, out: Path) -> Path:
    """The LoRA adapter merged into its base, saved as an HF model directory (weights and tokenizer)."""
    # Heavy imports, only for an adapter.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint_dir(base)), torch_dtype="auto")
    merged = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    merged.save_pretrained(str(out))
    load_tokenizer(base, quiet=True).save_pretrained(str(out))
    return out


def run_evaluation(runs: list[Stage], targets: list[EvalTarget], run_dir: Path, faults=None) -> dict:
    """Evaluate every target (runs[i] is targets[i]'s validated config and plan); returns eval.json's dict."""
    run_dir.mkdir(parents=True, exist_ok=True)
    samples_path = run_dir / SAMPLES_FILE
    samples_path.unlink(missing_ok=True)
    results: dict[str, dict] = {}
    for i, (stage, target) in enumerate(zip(runs, targets, strict=True)):
        cfg, out = stage.cfg, run_dir if len(runs) == 1 else run_dir / _dir_name(i, target.label)
        if len(runs) > 1:
            print(f"==== checkpoint {i + 1}/{len(runs)}: {target.label} ({target.path})", flush=True)
        if target.adapter is not None:
            merged = merge_adapter(target.adapter, str(cfg[ARR].model.path),
                                   run_dir / "merged" / _dir_name(i, target.label))
            log.info(f"{target.adapter} merged over {cfg[ARR].model.path} into {merged}")
            cfg = cfg.copy()
            with open_dict(cfg):
                OmegaConf.update(cfg, f"{ARR}.model.path", str(merged), merge=False)
        trainer = PPOTrainer(cfg, stage.plan, out, init_from=target.init_from, faults=faults)
        trainer.fit()
        results[target.label] = group_metrics(trainer.val_samples, list(cfg.eval.k))
        write_samples(samples_path, trainer.val_samples, checkpoint=target.label)
    text, md, png = write_report(results, run_dir)
    print(f"logicrl: evaluation, 95% intervals over problems (Wilson: mean@n and the completed shares; bootstrap: "
          f"pass@k, maj@k)\n{text}\nlogicrl: {run_dir / 'eval.json'}, {md}, {samples_path}"
          + (f", {png}" if png else ""), flush=True)
    return results
