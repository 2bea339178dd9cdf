"""The embedded reward model (`embedded:tiny_rm`): a tiny sequence classifier trained to agree with the rule reward.

    directory = tiny_rm_checkpoint_dir()          # built once under cache_root(), then cached
    # reward_model.model.path=embedded:tiny_rm resolves to it (models/loading.py checkpoint_dir)

It scores the embedded default's task (data/role_task.py) as reward/role.py does, so PPO with a learned
reward runs and is tested on CPU with nothing downloaded: a one-label Qwen2ForSequenceClassification
(TINY_RM_CONFIG, models/tiny.py) on the tiny actor's tokenizer, trained on the task's prompts with
RESPONSES_PER_PROMPT short responses drawn as the actor writes them, against the rule score less 0.5 at
every response token. The build repeats byte for byte on one machine, not across CPU instruction sets;
tiny_rm_build.json records its agreement on the test split and the CPU capability that built it. Build
time, agreement per instruction set and what +recipe=tiny_rm_ppo was checked against: docs/testing.md.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from logicrl.models.tiny import TINY_RM_CONFIG, build_once, cache_root, tiny_checkpoint_dir, tiny_fingerprint

SEED = 0
# role_task.generate's arguments, as `make data` passes them (data/README.md): the same prompts.
PEOPLE, TRAIN_PROMPTS, TEST_PROMPTS, DATA_SEED = 3, 2000, 200, 0
RESPONSES_PER_PROMPT = 8
MAX_RESPONSE_TOKENS = 4
# 600 steps left it at 88% agreement (it learns in a jump, around step 550); 1000 gets past it.
STEPS = 1000
BATCH = 64
LR = 3e-3
# The rule reward is +1 / 0 / -1; shifted so that the sign of the score is right versus not right.
TARGET_SHIFT = -0.5
# What names the cache (tiny_rm_fingerprint). Code is not hashed: a change to how examples are drawn
# or trained must bump "version", or an old cache is reused.
RECIPE = {"version": 1, "seed": SEED, "data": [PEOPLE, TRAIN_PROMPTS, TEST_PROMPTS, DATA_SEED],
          "responses_per_prompt": RESPONSES_PER_PROMPT, "max_response_tokens": MAX_RESPONSE_TOKENS,
          "steps": STEPS, "batch": BATCH, "lr": LR, "target_shift": TARGET_SHIFT}
BUILD_RECORD = "tiny_rm_build.json"


@dataclass(frozen=True)
class Example:
    prompt_ids: list[int]
    response_ids: list[int]
    role: str  # the ground truth: the stated role
    response: str  # the response decoded as the trainer hands it to the rule reward (no special tokens)
    rule_score: float  # the rule reward's score: +1 right, 0 the other role, -1 no role
    prefix_scores: tuple[float, ...]  # the rule score of the response cut after each of its tokens


def recipe(seed: int = SEED) -> dict:
    """RECIPE with another build seed (what benchmarks/tiny_rm_seeds.py builds to stand in for other machines)."""
    return {**RECIPE, "seed": seed}


def tiny_rm_fingerprint(seed: int = SEED) -> str:
    """Short hash of what the reward model is built from: its config, this recipe and the tokenizer's."""
    blob = json.dumps({"config": TINY_RM_CONFIG, "recipe": recipe(seed), "tokenizer": tiny_fingerprint()},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def tiny_rm_checkpoint_dir(cache_dir: str | os.PathLike | None = None, seed: int = SEED) -> Path:
    """The reward model's checkpoint (config.json, weights, tokenizer), built once under the cache root
    into a temporary directory and renamed into place (models/tiny.py build_once), so concurrent
    processes see a complete checkpoint or none. `embedded:tiny_rm` is the build with seed SEED."""
    final = cache_root(cache_dir) / f"tiny_rm-{tiny_rm_fingerprint(seed)}"
    return build_once(final, lambda path: _write_checkpoint(path, cache_dir, seed))


def rule_score(response: str, role: str) -> float:
    """reward/role.py's score of `response` (models/ may not import reward/; the test checks they agree)."""
    from logicrl.data.role_task import ROLES, answer_word

    word = answer_word(response)
    return 1.0 if word == role else 0.0 if word in ROLES else -1.0


def examples(rows: list[dict], tokenizer, per_prompt: int, seed: int) -> list[Example]:
    """`per_prompt` responses to each role_task row, drawn as the module docstring says, with their rule scores."""
    import random

    from logicrl.data.prompts import render_prompt
    from logicrl.data.role_task import ROLES

    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    plain = [i for i in range(len(tokenizer)) if i not in special]

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    # Other first words: plurals, other words of the task, and " Knight" (a role after all: the label
    # is whatever the rule says, so a look-alike in the wrong pool only teaches the rule's edge).
    neither = [ids(w) for w in (" knights", " knaves", " Knights", " the", " a", " not", " one", " Zoey", " is",
                                ".", ",", " truth", " liar", " honest", " Knight")]
    out = []
    for row in rows:
        prompt_text, add_special = render_prompt(row["prompt"], tokenizer, row.get("extra_info") or {})
        prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=add_special)
        role = row["reward_model"]["ground_truth"]["role"]
        other = ROLES[1 - ROLES.index(role)]
        for k in range(per_prompt):
            kind = k % 4
            if kind == 0:
                head = ids(rng.choice([f" {role}", role, f" {role.capitalize()}"]))
            elif kind == 1:
                head = ids(rng.choice([f" {other}", other, f" {other.capitalize()}"]))
            elif kind == 2:
                head = rng.choice(neither) + (ids(f" {rng.choice(ROLES)}") if rng.random() < 0.5 else [])
            else:
                head = [rng.choice(plain)]
            length = rng.randint(1, MAX_RESPONSE_TOKENS)
            response_ids = (head + [rng.choice(plain) for _ in range(MAX_RESPONSE_TOKENS)])[:length]
            if len(response_ids) < MAX_RESPONSE_TOKENS and rng.random() < 0.5:
                response_ids.append(tokenizer.eos_token_id)  # the actor stopped
            text = tokenizer.decode(response_ids, skip_special_tokens=True)
            prefixes = tuple(rule_score(tokenizer.decode(response_ids[:j], skip_special_tokens=True), role)
                             for j in range(1, len(response_ids) + 1))
            out.append(Example(prompt_ids, response_ids, role, text, prefixes[-1], prefixes))
    return out


def batch(items: list[Example], pad_id: int):
    """Right-padded (input_ids, attention_mask, position_ids) [B, T] of prompt + response rows."""
    import torch

    rows = [e.prompt_ids + e.response_ids for e in items]
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def scores(model, items: list[Example], pad_id: int, micro_batch_size: int = 256):
    """[N] fp32 scores of `items`, read at each row's last real token as models/reward_model.py reads them."""
    import torch

    with torch.no_grad():
        return torch.cat([_forward(model, *batch(items[i:i + micro_batch_size], pad_id))
                          for i in range(0, len(items), micro_batch_size)])


def agreement(score, items: list[Example]) -> float:
    """Share of items where the score is positive exactly when the rule reward says the answer is right."""
    right = [e.rule_score == 1.0 for e in items]
    return sum((float(s) > 0) == r for s, r in zip(score, right)) / len(items)


def train(model, items: list[Example], pad_id: int, steps: int = STEPS, seed: int = SEED) -> list[float]:
    """Regress the score onto rule score + TARGET_SHIFT at every response token, each against the rule
    score of the response cut there (the last token's is the whole response's, the one the reward
    worker reads); the loss every 100 steps. The earlier tokens' targets are free supervision: they teach
    the model where the answer is (the first response token) before it must find it from further on."""
    import torch

    from logicrl.models.tiny_pretrain import warmup_cosine

    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    schedule = warmup_cosine(optimizer, 30, steps)
    model.train()
    losses = []
    for step in range(steps):
        chosen = [items[i] for i in torch.randint(len(items), (BATCH,), generator=g)]
        input_ids, attention_mask, position_ids = batch(chosen, pad_id)
        targets = torch.full(input_ids.shape, math.nan)
        for row, e in enumerate(chosen):
            start = len(e.prompt_ids)
            targets[row, start:start + len(e.response_ids)] = torch.tensor(e.prefix_scores) + TARGET_SHIFT
        hidden = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                             use_cache=False).last_hidden_state
        score = model.score(hidden)[..., 0]  # [B, T]
        scored = ~targets.isnan()
        loss = torch.nn.functional.mse_loss(score[scored], targets[scored])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == steps - 1:
            losses.append(round(float(loss.detach()), 4))
    model.eval()
    return losses


def _forward(model, input_ids, attention_mask, position_ids):
    import torch

    # Here, not at the top: importing this module stays free of torch, as every function's import does.
    from logicrl.models.packing import last_token_index

    # The decoder and the `score` head, read at the last real token: what the reward worker's token
    # classifier computes from the same weights (models/reward_model.py), not transformers' sequence
    # classifier's pad-id search.
    hidden = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=False).last_hidden_state
    rows = torch.arange(input_ids.shape[0])
    return model.score(hidden[rows, last_token_index(attention_mask)])[:, 0].float()


def _write_checkpoint(path: Path, cache_dir: str | os.PathLike | None, seed: int = SEED) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer, Qwen2Config

    from logicrl.data.role_task import generate

    start = time.perf_counter()
    print(f"logicrl: building the embedded reward model in {path.parent} (first run only: a minute or more of "
          "training)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_checkpoint_dir(cache_dir), local_files_only=True)
    tokenizer.save_pretrained(path)
    config = Qwen2Config(**{k: v for k, v in TINY_RM_CONFIG.items() if k not in ("model_type", "num_labels")},
                         num_labels=1, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.pad_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    config.vocab_size = len(tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    splits = generate(PEOPLE, TRAIN_PROMPTS, TEST_PROMPTS, DATA_SEED)
    train_items = examples(splits["train"], tokenizer, RESPONSES_PER_PROMPT, seed=seed)
    # The held-out responses are the same for every build seed, so their agreements compare.
    test_items = examples(splits["test"], tokenizer, RESPONSES_PER_PROMPT, seed=SEED + 1)
    losses = train(model, train_items, tokenizer.pad_token_id, seed=seed)
    held_out = agreement(scores(model, test_items, tokenizer.pad_token_id), test_items)
    model.save_pretrained(path)
    # Not the same bytes on every machine: float sums in torch's and the BLAS's kernels follow the CPU's
    # instruction set (and thread count), so the record says which built it (docs/testing.md).
    record = {"fingerprint": tiny_rm_fingerprint(seed), "recipe": recipe(seed), "losses": losses,
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
              "torch": torch.__version__,
              "held_out_agreement": held_out, "held_out_responses": len(test_items),
              "build_s": round(time.perf_counter() - start, 1)}
    (path / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(f"logicrl: embedded reward model built in {record['build_s']} s; held-out agreement with the rule reward "
          f"{held_out:.1%} on {len(test_items)} responses", flush=True)
