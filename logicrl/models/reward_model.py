"""The learned reward model: loading it frozen, and scoring rows at their last real token.

    model = load_reward_model(path, dtype)
    scores = score_rows(model, input_ids, attention_mask, position_ids, micro_batch_size=8)   # [B] fp32

Every kind of reward model (models/reward_head.py) loads as transformers' AutoModelForTokenClassification
with one label, as verl's worker loads it and as the critic is built (models/loading.py load_value_model),
so the workers shard, offload and load it on meta as they do the critic. A sequence classifier's `score`
weight loads into it unchanged (told it has no bias); OpenRLHF's `value_head` is renamed to `score`.

A row's score is its token score at its last real token (models/packing.py last_token_index), not what
transformers' sequence classifier picks: that finds the last token that is not the pad id, wrong when pad
is eos and the response ends with eos, and gives one score per row, which a packed row cannot use.
"""

from __future__ import annotations

import torch

from logicrl.models.loading import checkpoint_dir, quiet_transformers
from logicrl.models.packing import last_token_index, pack_last
from logicrl.models.reward_head import reward_head
from logicrl.models.ulysses import SequenceParallel, gather_tokens, local_positions, sp_forward


class RewardModelLoadError(ValueError):
    pass


def load_reward_model(path: str, dtype: torch.dtype, trust_remote_code: bool = False, on_meta: bool = False,
                      attn_implementation: str | None = None) -> torch.nn.Module:
    """The reward model at `path` on CPU in `dtype`, frozen and in eval mode (no dropout).

    `on_meta`: the architecture only, every tensor on meta, for a rank that receives its shards from
    rank 0 (workers/sharded_load.py). Raises RewardModelLoadError if the head's weights are not in
    the checkpoint (they would be random)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    quiet_transformers()
    head = reward_head(path)
    directory = checkpoint_dir(path)
    config = AutoConfig.from_pretrained(directory, local_files_only=True, trust_remote_code=trust_remote_code,
                                        num_labels=1)
    # Read by transformers' token classifier when it builds its head: a sequence classifier's has no bias.
    config.token_classification_bias = head.bias
    if on_meta:
        with torch.device("meta"):
            model = AutoModelForTokenClassification.from_config(config, dtype=dtype,
                                                                attn_implementation=attn_implementation,
                                                                trust_remote_code=trust_remote_code)
    else:
        key_mapping = {f"^{head.prefix}\\.": "score."} if head.prefix != "score" else None
        model, info = AutoModelForTokenClassification.from_pretrained(
            directory, config=config, dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code,
            attn_implementation=attn_implementation, key_mapping=key_mapping, output_loading_info=True)
        missing = [k for k in info["missing_keys"] if k.startswith("score.")]
        if missing:
            raise RewardModelLoadError(f"{path}: the reward head's {', '.join(missing)} is not in the checkpoint, so "
                                       "its scores would be random: point reward_model.model.path at a trained "
                                       "reward model")
    model.config.use_cache = False
    model.requires_grad_(False)
    return model.eval()


@torch.no_grad()
def sequence_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                    remove_padding: bool = False, sp: SequenceParallel | None = None) -> torch.Tensor:
    """[B] fp32 score of each row (one micro-batch) at its last real token. With `remove_padding` the
    forward runs on the real tokens packed into one row (models/packing.py), the padding never computed;
    with `sp` too, on this rank's 1/S of that row, the group summing the pieces (models/ulysses.py)."""
    if sp is not None:
        if not remove_padding:
            raise ValueError("sequence parallelism runs on packed rows: set reward_model.model.use_remove_padding=true")
        ids, positions, last = pack_last(input_ids, attention_mask, position_ids)
        out, start, stop = sp_forward(model, ids, positions, sp, use_cache=False)
        return gather_tokens(out.logits[0, local_positions(last, start, stop), 0].float(), last, start, stop, sp)
    if remove_padding:
        ids, positions, last = pack_last(input_ids, attention_mask, position_ids)
        out = model(input_ids=ids, attention_mask=None, position_ids=positions, use_cache=False)
        return out.logits[0, last, 0].float()
    out = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    rows = torch.arange(input_ids.shape[0], device=input_ids.device)
    return out.logits[rows, last_token_index(attention_mask), 0].float()


def score_rows(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
               micro_batch_size: int, remove_padding: bool = False, sp: SequenceParallel | None = None) -> torch.Tensor:
    """[B] fp32 scores of a rank's rows, `micro_batch_size` rows per forward (the last may be smaller)."""
    parts = [sequence_scores(model, input_ids[i:i + micro_batch_size], attention_mask[i:i + micro_batch_size],
                             position_ids[i:i + micro_batch_size], remove_padding, sp)
             for i in range(0, input_ids.shape[0], micro_batch_size)]
    return torch.cat(parts)


def token_level_scores(scores: torch.Tensor, response_attention_mask: torch.Tensor) -> torch.Tensor:
    """[B] sequence scores -> [B, R] with each score on its response's last attended token, zeros elsewhere:
    the token_level_scores a rule reward also fills (as verl's reward-model worker returns them). The
    attention mask, not the loss mask: the response ends where the model stopped, trained or not."""
    out = torch.zeros(response_attention_mask.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.arange(scores.shape[0], device=scores.device)
    out[rows, last_token_index(response_attention_mask)] = scores
    return out
