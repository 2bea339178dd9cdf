"""A short language-model pre-training of the embedded tiny model on the project's own text.

Random weights emit each of the tiny tokenizer's ~760 tokens about equally, so an RL reward on
words like "knight" is almost never earned and nothing can be learned in minutes. A few hundred
next-token steps on the K&K corpus the tokenizer was trained on (puzzles, reasoning lines,
solutions; models/tiny_tokenizer.corpus) give the model the language of the task, as a real
base model would have it, and nothing more: it never sees the embedded task (data/role_task.py)
nor its rewards, so what RL then learns is RL's doing. Built once with the weights; seeded.
"""

from __future__ import annotations

import math

import torch

SEQ_LEN = 256
BATCH = 16
STEPS = 150
LR = 3e-3
SEED = 0


def packed_corpus(tokenizer) -> torch.Tensor:
    """The corpus as [n, SEQ_LEN] token blocks (documents concatenated, as in LM pre-training)."""
    from logicrl.models.tiny_tokenizer import corpus

    ids: list[int] = []
    for doc in corpus():
        ids += tokenizer(doc, add_special_tokens=False)["input_ids"]
    n = len(ids) // SEQ_LEN
    return torch.tensor(ids[: n * SEQ_LEN]).view(n, SEQ_LEN)


def warmup_cosine(optimizer, warmup: int, steps: int):
    """Linear warm-up over `warmup` steps times a cosine decay to 0 at `steps` (the tiny models' schedule)."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / steps)))


def pretrain(model: torch.nn.Module, tokenizer, steps: int = STEPS) -> list[float]:
    """Train `model` in place with next-token loss; returns the loss every 50 steps."""
    g = torch.Generator().manual_seed(SEED)
    blocks = packed_corpus(tokenizer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    schedule = warmup_cosine(optimizer, 20, steps)
    model.train()
    losses = []
    for step in range(steps):
        batch = blocks[torch.randint(len(blocks), (BATCH,), generator=g)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            losses.append(float(loss.detach()))
    model.eval()
    return losses
