"""Log-probs and entropy of given tokens, from final hidden states, in chunks of tokens.

DESIGN.md memory rule 2: full-vocab fp32 logits are never materialised for a whole micro-batch (8 x
4096 tokens of Qwen2.5's 152k vocabulary is 20 GB, which autograd would keep until backward). The
lm_head projection, log-softmax and entropy run `chunk_tokens` rows at a time, and the backward is
derived by hand (a custom autograd.Function, not checkpointing per chunk): the gradients w.r.t. the
logits have closed forms, so each chunk needs two [chunk, V] buffers, whatever order autograd takes.

Definitions (what the rollout engines must reproduce, workers/rollout/base.py):
    z        = float32(hidden @ W^T + b) / temperature        # [N, V], one chunk at a time
    logprob  = z[target] - logsumexp(z)
    entropy  = logsumexp(z) - sum(softmax(z) * z)  = -sum(p * log p)
The matmul runs in the weight's dtype and its output is upcast, as HF's lm_head followed by
`.float()` and vLLM's sampler do; in fp32 (the tests, CPU runs) these are exactly fp32 logits.
"""

from __future__ import annotations

import torch
from torch import nn

from logicrl.models.packing import pack
from logicrl.models.ulysses import SequenceParallel, gather_tokens, local_positions, sp_forward, sp_range


def _chunk_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  temperature: float) -> torch.Tensor:
    """Tempered fp32 logits of one chunk. hidden [c, H], weight [V, H] -> [c, V] fp32."""
    z = nn.functional.linear(hidden, weight, bias).float()
    # .float() is a no-op (same tensor) in fp32, but linear's output is fresh, so in place is safe.
    return z.div_(temperature)


class _ChunkedTokenLogProb(torch.autograd.Function):
    """Forward and backward over chunks of rows; see the module docstring."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, temperature, chunk_tokens, with_entropy):
        # hidden [N, H], weight [V, H], bias [V] | None, target [N] (int64)
        n = hidden.shape[0]
        logprobs = torch.empty(n, dtype=torch.float32, device=hidden.device)  # [N]
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)  # [N]
        entropy = torch.empty(n, dtype=torch.float32, device=hidden.device) if with_entropy else None  # [N]
        for start in range(0, n, chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            logp = _chunk_logits(hidden[rows], weight, bias, temperature)  # [c, V], z for now
            chunk_lse = torch.logsumexp(logp, dim=-1)  # [c]
            logp.sub_(chunk_lse[:, None])  # now log p, in place: one [c, V] buffer so far
            logprobs[rows] = logp.gather(1, target[rows, None]).squeeze(1)
            lse[rows] = chunk_lse
            if with_entropy:
                # -sum(p log p), equal to lse - sum(p z) but without a third [c, V] buffer.
                entropy[rows] = -(logp.exp().mul_(logp)).sum(dim=-1)
        ctx.save_for_backward(hidden, weight, bias, target, lse, entropy)
        ctx.temperature = temperature
        ctx.chunk_tokens = chunk_tokens
        if entropy is not None:
            return logprobs, entropy
        return logprobs, None

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        # grad_logprobs [N] (zeros when only the entropy was used), grad_entropy [N] | None
        hidden, weight, bias, target, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None  # [N, H]
        # Accumulated across chunks in the weight's own dtype, as autograd does for any weight
        # used more than once (tied embeddings too); an fp32 buffer would cost another [V, H].
        grad_weight = torch.zeros_like(weight) if need_weight else None  # [V, H]
        grad_bias = torch.zeros_like(bias) if bias is not None and need_bias else None  # [V]
        use_entropy = entropy is not None and grad_entropy is not None
        for start in range(0, hidden.shape[0], ctx.chunk_tokens):
            rows = slice(start, start + ctx.chunk_tokens)
            h = hidden[rows]  # [c, H]
            logp = _chunk_logits(h, weight, bias, ctx.temperature).sub_(lse[rows, None])  # [c, V] log p
            p = logp.exp()  # [c, V]
            g_lp = grad_logprobs[rows, None]  # [c, 1]
            # d logprob / dz = onehot(target) - p
            # d entropy / dz = -p * (z - E_p[z]) = -p * (log p + entropy)
            if use_entropy:
                grad_z = logp.add_(entropy[rows, None]).mul_(p).mul_(-grad_entropy[rows, None])
                grad_z.sub_(p.mul_(g_lp))
            else:
                grad_z = p.mul_(g_lp).neg_()
            grad_z.scatter_add_(1, target[rows, None], g_lp)
            grad_z = grad_z.div_(ctx.temperature).to(weight.dtype)  # dz/dlogits = 1/T
            if grad_hidden is not None:
                grad_hidden[rows] = grad_z @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_z.T, h)
            if grad_bias is not None:
                grad_bias += grad_z.sum(dim=0)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None


def token_logprobs_and_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target_ids: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each target token, and optionally the entropy, under softmax(lm_head(hidden) / T).

    hidden      [N, H] or [B, T, H]: final (normed) hidden states, any float dtype
    weight      [V, H]: the lm_head weight (tied or not); bias [V] or None
    target_ids  [N] or [B, T]: every entry must be a valid token id; mask padding afterwards
    returns     logprobs [N] or [B, T] fp32, entropy of the same shape (fp32) or None

    Differentiable w.r.t. hidden, weight and bias through both outputs. Peak extra memory is
    about two [chunk_tokens, V] fp32 buffers in forward and in backward, plus in backward a
    [V, H] gradient for the weight.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be >= 1")
    if temperature <= 0:
        raise ValueError(f"temperature={temperature} must be > 0 (greedy decoding still scores at a T > 0)")
    if target_ids.shape != hidden.shape[:-1]:
        raise ValueError(f"target_ids {tuple(target_ids.shape)} must match hidden {tuple(hidden.shape)} "
                         "without its last dimension")
    lead_shape = target_ids.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])  # [N, H]
    flat_target = target_ids.reshape(-1).long()  # [N]
    logprobs, entropy = _ChunkedTokenLogProb.apply(flat_hidden, weight, bias, flat_target, float(temperature),
                                                   int(chunk_tokens), bool(with_entropy))
    return logprobs.view(lead_shape), (entropy.view(lead_shape) if entropy is not None else None)


def causal_lm_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_len: int,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
    remove_padding: bool = False,
    sp: SequenceParallel | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the last `response_len` tokens of each row under a causal LM.

    input_ids, attention_mask, position_ids  [B, T]: left-padded prompt then right-padded response
    returns  logprobs [B, R] fp32, entropy [B, R] fp32 or None, R = response_len; padded
             response positions hold numbers for the pad token and must be masked by the caller.

    With `remove_padding`, the forward runs on the real tokens only, packed into one row
    (models/packing.py), and only real response tokens are scored; padded response positions
    hold 0. Real positions equal the padded path's.

    With `sp` (Ulysses sequence parallelism, models/ulysses.py; needs `remove_padding`) this rank runs
    the model on its 1/S of the packed row, scores the response tokens whose scoring hidden state it
    holds, and the group's pieces are summed into the same [B, R] on every rank.

    The hidden state at position t scores token t+1, so response token j (at T-R+j) is scored by
    the hidden state at T-R+j-1: positions T-R-1 .. T-2.

    `model` is a HF *ForCausalLM (Qwen2, Llama, ...) or a peft wrapper of one. The decoder and
    lm_head are found through get_decoder() / get_output_embeddings(), which peft forwards to the
    base model. The model's own forward is called, not the decoder's: under FSDP2 the root
    module's pre-forward hook is what all-gathers the parameters it owns (embeddings, final norm,
    lm_head), so bypassing it would hand us sharded tensors. The chunked kernel therefore runs
    inside that forward, in a hook on the decoder's output, and the model's own lm_head only
    sees the last position (logits_to_keep=1: [B, 1, V], negligible).
    """
    seq_len = input_ids.shape[1]
    if not 1 <= response_len < seq_len:
        raise ValueError(f"response_len={response_len} must be in [1, {seq_len - 1}] for sequences of {seq_len}"
                         " tokens (at least one prompt token scores the first response token)")
    lm_head = model.get_output_embeddings()
    # A peft LoRA layer on lm_head is not an nn.Linear; using its .weight would silently drop the
    # adapter's delta.
    if not isinstance(lm_head, nn.Linear):
        raise TypeError(f"chunked log-probs need a plain nn.Linear lm_head, got {type(lm_head).__name__}; "
                        "with LoRA, leave lm_head out of actor_rollout_ref.model.target_modules")
    decoder = model.get_decoder()
    result: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    packed = pack(input_ids, attention_mask, position_ids, response_len) if remove_padding else None
    if sp is not None and packed is None:
        raise ValueError("sequence parallelism runs on packed rows: set "
                         "actor_rollout_ref.model.use_remove_padding=true")
    shard: dict[str, int] = {}  # with sp: this rank's token range [start, stop) of the padded packed row

    def score_response(module, args, output):
        hidden = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]  # [B, T, H]
        kw = dict(bias=lm_head.bias, temperature=temperature, chunk_tokens=chunk_tokens, with_entropy=with_entropy)
        if packed is None:
            result["out"] = token_logprobs_and_entropy(
                hidden[:, seq_len - response_len - 1: seq_len - 1],  # [B, R, H]
                lm_head.weight, input_ids[:, seq_len - response_len:], **kw)  # [B, R]
            return
        if sp is not None:  # this rank's scoring states only, then the group's sum of disjoint pieces
            start, stop = shard["start"], shard["stop"]
            mine = (packed.score_index >= start) & (packed.score_index < stop)
            logprobs, entropy = token_logprobs_and_entropy(
                hidden[0, local_positions(packed.score_index, start, stop)], lm_head.weight, packed.targets[mine], **kw)
            # One exchange for both (two would be independent backward branches: see ulysses.seq_to_heads).
            both = gather_tokens(torch.stack([logprobs] + ([entropy] if entropy is not None else []), 1),
                                 packed.score_index, start, stop, sp)  # [M, 1 or 2]
            logprobs, entropy = both[:, 0], (both[:, 1] if entropy is not None else None)
            result["out"] = packed.unpack(logprobs), (packed.unpack(entropy) if entropy is not None else None)
            return
        logprobs, entropy = token_logprobs_and_entropy(hidden[0, packed.score_index], lm_head.weight,
                                                       packed.targets, **kw)  # [M] each
        result["out"] = packed.unpack(logprobs), (packed.unpack(entropy) if entropy is not None else None)

    handle = decoder.register_forward_hook(score_response)
    try:
        if packed is None:
            model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                  use_cache=False, logits_to_keep=1)
        elif sp is not None:  # the hook runs inside the forward: it needs the range before
            rows = sp_range(packed.input_ids.shape[1], sp)
            shard.update(start=rows[0], stop=rows[1])
            sp_forward(model, packed.input_ids, packed.position_ids, sp, use_cache=False, logits_to_keep=1)
        else:  # no mask: transformers reads the sequences' bounds from the restarting positions
            model(input_ids=packed.input_ids, attention_mask=None, position_ids=packed.position_ids,
                  use_cache=False, logits_to_keep=1)
    finally:
        handle.remove()
    if "out" not in result:
        raise RuntimeError(f"{type(decoder).__name__} (from get_decoder()) did not run during the forward; "
                           "this model class is not supported by causal_lm_logprobs")
    return result["out"]
