"""The FSDP2 policy: log-probs of given responses, and the PPO-style update.

A batch is a TensorDict of one rank's responses:
    input_ids, attention_mask, position_ids  [N, P+R]  left-padded prompt, right-padded response
    responses, response_mask                 [N, R]
    advantages                               [N, R]    (update only)
    old_log_probs                            [N, R]    (update; absent when the step is on-policy)
    ref_log_probs                            [N, R]    (update, with the KL loss)
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from tensordict import TensorDict

from logicrl.algos import (
    agg_loss,
    approx_kl_metrics,
    compute_policy_loss,
    entropy_bonus,
    kl_penalty,
    loss_normalizer,
    masked_mean,
    policy_clip_metrics,
)
from logicrl.models.logprob import causal_lm_logprobs
from logicrl.trainer.faults import maybe_fail
from logicrl.workers.fsdp import all_reduce_sum, clip_grad_norm, drop_unreduced_grads
from logicrl.workers.micro import split_fixed
from logicrl.workers.oom import MicroSize, retry_on_oom

# Tokens per chunk of the chunked lm_head: bounds the fp32 [chunk, V] logits alive at once.
LOGPROB_CHUNK_TOKENS = 1024


def response_logprobs(model, batch: TensorDict, temperature: float, with_entropy: bool = False):
    """Log-probs [N, R] (and entropy) of batch["responses"] under `model`, chunked over tokens."""
    return causal_lm_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                              batch["responses"].shape[1], temperature=temperature,
                              chunk_tokens=LOGPROB_CHUNK_TOKENS, with_entropy=with_entropy)


@torch.no_grad()
def forward_logprobs(model, batch: TensorDict, size: MicroSize, temperature: float, call: int = 0) -> torch.Tensor:
    """Forward-only log-probs of a rank's batch [N, R], split as `size` says (rows of fixed count, or
    packed to a token budget); rows come back in the batch's order either way."""
    model.eval()
    parts, order = size.split(batch, batch.device, with_index=True)
    out = []
    for i, mb in enumerate(parts):
        if i == len(parts) - 1:
            maybe_fail(size.phase, call, kinds=("oom",))  # fault injection (tests): an OOM at the last micro-batch
        out.append(response_logprobs(model, mb, temperature)[0])
    out = torch.cat(out)
    return out if order is None else out[torch.argsort(order)]


class Actor:
    """Owns the sharded policy, its optimizer and scheduler; `update` runs one training step."""

    def __init__(self, model, optimizer, scheduler, cfg: DictConfig, temperature: float, device: torch.device,
                 world_size: int):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.cfg, self.temperature, self.device, self.world_size = cfg, temperature, device, world_size
        self.micro_size = MicroSize.from_config("update_actor", "actor_rollout_ref.actor", cfg, cfg.use_dynamic_bsz,
                                                "ppo_micro_batch_size_per_gpu", "ppo_max_token_len_per_gpu")
        self.calls = 0  # update() calls: the step, for fault injection

    def update(self, batch: TensorDict, per_rank_mini: int) -> dict[str, float]:
        """ppo_epochs passes over `batch` in mini-batches of `per_rank_mini` rows, one optimizer step each."""
        cfg = self.cfg
        self.model.train()
        self.calls += 1
        sums: dict[str, list[float]] = {}
        for _ in range(cfg.ppo_epochs):
            for mini in split_fixed(batch, per_rank_mini):
                for key, value in self._step(mini).items():
                    sums.setdefault(key, []).append(value)
        self.scheduler.step()
        metrics = {k: sum(v) / len(v) for k, v in sums.items()}
        metrics["actor/lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def _step(self, mini: TensorDict) -> dict[str, float]:
        cfg = self.cfg
        mode = cfg.loss_agg_mode
        # One normaliser for the whole mini-batch across ranks, so micro-batch losses add up to the
        # mini-batch loss exactly (algos/aggregation.py). FSDP2 averages gradients over ranks,
        # hence the world_size factor.
        normalizer = all_reduce_sum(float(loss_normalizer(mini["response_mask"], mode)), self.device)
        stats, count = retry_on_oom(self.micro_size, lambda _: self._accumulate(mini, normalizer),
                                    self.device, reset=lambda: drop_unreduced_grads(self.model))
        grad_norm = clip_grad_norm(self.model, cfg.grad_clip)
        if torch.isfinite(torch.tensor(grad_norm)):
            self.optimizer.step()
        loss = stats.pop("actor/loss")  # a sum, not a mean: the mini-batch's loss however it was split
        stats = {k: v / count for k, v in stats.items()}
        stats["actor/loss"], stats["actor/grad_norm"] = loss, grad_norm
        stats["perf/oom_retries/update_actor"] = self.micro_size.retries
        stats["perf/micro_size/update_actor"] = self.micro_size.value
        self.optimizer.zero_grad(set_to_none=True)
        return stats

    def _accumulate(self, mini: TensorDict, normalizer: float) -> tuple[dict[str, float], int]:
        """Forward + backward of every micro-batch of `mini` (gradients add up); its stats summed."""
        cfg = self.cfg
        mode = cfg.loss_agg_mode
        max_len = mini["responses"].shape[1]
        micro_batches = self.micro_size.split(mini, self.device)
        stats: dict[str, float] = {}
        for i, micro in enumerate(micro_batches):
            self.model.set_requires_gradient_sync(i == len(micro_batches) - 1)
            if i == len(micro_batches) - 1:
                maybe_fail("update_actor", self.calls, kinds=("oom",))  # fault injection: after earlier micro-batches' grads
            mask = micro["response_mask"]
            log_probs, entropy = response_logprobs(self.model, micro, self.temperature, with_entropy=True)
            # On-policy steps skip the old-log-prob pass: the policy that sampled the batch is the
            # one being updated, so its log-probs are these, and the ratio is exactly 1.
            old = micro["old_log_probs"] if "old_log_probs" in micro.keys() else log_probs.detach()
            out = compute_policy_loss(cfg.policy_loss.loss_mode, log_probs, old, micro["advantages"], mask,
                                      clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                                      clip_ratio_c=cfg.clip_ratio_c)
            token_loss = out.token_loss + entropy_bonus(entropy, mask, cfg.entropy_coeff)
            if cfg.use_kl_loss:
                kl = kl_penalty(log_probs, micro["ref_log_probs"], mask, cfg.kl_loss_type)
                token_loss = token_loss + cfg.kl_loss_coef * kl
                _add(stats, "actor/kl_loss", masked_mean(kl.detach(), mask))
            loss = agg_loss(token_loss, mask, mode, normalizer=normalizer, max_response_length=max_len)
            (loss * self.world_size).backward()
            _add(stats, "actor/loss", loss.detach())
            _add(stats, "actor/pg_loss", masked_mean(out.token_loss.detach(), mask))
            _add(stats, "actor/entropy", masked_mean(entropy.detach(), mask))
            for key, value in policy_clip_metrics(out.ratio.detach(), micro["advantages"], mask, cfg.clip_ratio_low,
                                                  cfg.clip_ratio_high, cfg.clip_ratio_c).items():
                _add(stats, key, value)
            for key, value in approx_kl_metrics(log_probs.detach(), old, mask).items():
                _add(stats, key, value)
        return stats, len(micro_batches)


def _add(stats: dict[str, float], key: str, value) -> None:
    stats[key] = stats.get(key, 0.0) + float(value)
