"""Shared by tests/models: a batch laid out as the trainer lays it out."""

import torch

PAD = 0


def trainer_batch(prompt_lens, response_lens, p_width, r_width, vocab=2048, seed=1):
    """[N, P+R] ids, mask, positions as workers/hybrid.py lays them out, with random real tokens."""
    g = torch.Generator().manual_seed(seed)
    n = len(prompt_lens)
    ids = torch.full((n, p_width + r_width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        ids[i, p_width - p: p_width + r] = torch.randint(1, vocab, (p + r,), generator=g)
        mask[i, p_width - p: p_width + r] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)
