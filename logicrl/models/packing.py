"""Packed sequences (use_remove_padding): a micro-batch's real tokens as one row, no padding.

    packed = pack(input_ids, attention_mask, position_ids, response_len)
    out = model(input_ids=packed.input_ids, position_ids=packed.position_ids, attention_mask=None)
    per_response = packed.unpack(out_at_scoring_positions)          # [B, R], 0 where padded

Each row's real tokens are one contiguous run with positions 0..n-1 (a left-padded prompt, then a
right-padded response); packing concatenates the runs into [1, L] and keeps their positions. With no
attention mask, the attention reads the restarts as sequence boundaries; models/attention.py chooses
the kernel a packed model is loaded with (flash-attn varlen, or torch SDPA per sequence), both without
any mask, so attention costs exactly the sum of each sequence's own. It saves the padded tokens'
compute and the [B, T, T] padding mask. (transformers' plain sdpa would build a dense [L, L]
block-diagonal mask here: never load a packed model with it.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Packed:
    input_ids: torch.Tensor  # [1, L] the real tokens of every row, row after row
    position_ids: torch.Tensor  # [1, L] each row's own positions (restarting at 0)
    score_index: torch.Tensor  # [M] packed index of the hidden state that scores each real response token
    response_index: torch.Tensor  # [M] where that token sits in the flattened [B, R] response block
    targets: torch.Tensor  # [M] the real response tokens
    shape: tuple[int, int]  # (B, R)

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """[M, ...] per real response token -> [B, R, ...], zeros at padded response positions."""
        b, r = self.shape
        out = values.new_zeros((b * r, *values.shape[1:]))
        return out.index_copy(0, self.response_index, values).view(b, r, *values.shape[1:])


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
         response_len: int) -> Packed:
    """input_ids, attention_mask, position_ids [B, T] (left-padded prompt, right-padded response of
    R = response_len columns) -> their real tokens packed into one row, and where each real response
    token is scored: by the hidden state of the token just before it, as in the padded path."""
    b, t = input_ids.shape
    real = attention_mask.reshape(-1).bool()  # [B*T]
    keep = real.nonzero().squeeze(1)  # [L] flat padded index of each real token
    # packed_at[i] = position of padded flat index i in the packed row (only read where real).
    packed_at = torch.cumsum(real.long(), 0) - 1  # [B*T]
    resp_real = attention_mask[:, t - response_len:].reshape(-1).bool()  # [B*R]
    response_index = resp_real.nonzero().squeeze(1)  # [M]
    rows, cols = response_index // response_len, response_index % response_len
    flat = rows * t + (t - response_len) + cols  # [M] padded flat index of the response token
    # The token before a real response token is real: the response's previous token or the
    # prompt's last (prompts are left-padded and never empty).
    return Packed(input_ids=input_ids.reshape(-1)[keep][None], position_ids=position_ids.reshape(-1)[keep][None],
                  score_index=packed_at[flat - 1], response_index=response_index,
                  targets=input_ids.reshape(-1)[flat], shape=(b, response_len))


def pack_last(input_ids: torch.Tensor, attention_mask: torch.Tensor,
              position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """input_ids, attention_mask, position_ids [B, T] (any padding side) -> the real tokens packed
    into one row, ids and positions [1, L], and the packed index of each row's last real token [B]:
    where a reward model reads its score (models/reward_model.py)."""
    real = attention_mask.reshape(-1).bool()  # [B*T]
    keep = real.nonzero().squeeze(1)  # [L]
    last = attention_mask.sum(-1).cumsum(0) - 1  # [B] rows follow each other in the packed row
    return input_ids.reshape(-1)[keep][None], position_ids.reshape(-1)[keep][None], last


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] -> [B] column of each row's last real token, whatever side the row is padded on."""
    columns = torch.arange(1, attention_mask.shape[1] + 1, device=attention_mask.device)
    return (attention_mask * columns).argmax(-1)
