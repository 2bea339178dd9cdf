"""The FSDP2 policy: log-probs of given responses, and the PPO-style loss its update minimises.

A batch is a TensorDict of one rank's responses:
    input_ids, attention_mask, position_ids  [N, P+R]  left-padded prompt, right-padded response: what
                                                        the model attends to, every forward's input
    responses                                [N, R]
    response_mask                            [N, R]    the loss mask: what the loss, entropy, KL and
                                                        metrics count (trainer/batch.py)
    rollout_log_probs                        [N, R]    the engine's: rollout/logprob_diff, rollout correction
    advantages                               [N, R]    (update only)
    old_log_probs                            [N, R]    (update; absent when the step is on-policy; the
                                                        engine's own in rollout correction's bypass mode)
    ref_log_probs                            [N, R]    (update, with the KL loss)
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from tensordict import TensorDict

from logicrl.algos import (
    RolloutCorrection,
    agg_loss,
    apply_correction,
    approx_kl_metrics,
    compute_policy_loss,
    entropy_bonus,
    entropy_metrics,
    kl_penalty,
    masked_mean,
    mismatch_metrics,
)
from logicrl.config.loss_module import import_loss_module
from logicrl.models.logprob import causal_lm_logprobs
from logicrl.models.spec import LOGPROB_CHUNK_TOKENS
from logicrl.models.ulysses import SequenceParallel
from logicrl.workers.oom import MicroSize
from logicrl.workers.update import Trained, run_update


def response_logprobs(model, batch: TensorDict, temperature: float, with_entropy: bool = False,
                      remove_padding: bool = False, sp: SequenceParallel | None = None):
    """Log-probs [N, R] (and entropy) of batch["responses"] under `model`, chunked over tokens;
    with `remove_padding`, on the real tokens packed into one row (0 at padded positions)."""
    return causal_lm_logprobs(model, batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                              batch["responses"].shape[1], temperature=temperature,
                              chunk_tokens=LOGPROB_CHUNK_TOKENS, with_entropy=with_entropy,
                              remove_padding=remove_padding, sp=sp)


@torch.no_grad()
def forward_logprobs(model, batch: TensorDict, size: MicroSize, temperature: float,
                     remove_padding: bool = False, sp: SequenceParallel | None = None) -> torch.Tensor:
    """Forward-only log-probs of a rank's batch [N, R], split as `size` says (rows of fixed count, or
    packed to a token budget); rows come back in the batch's order either way."""
    model.eval()
    parts, order = size.split(batch, batch.device, with_index=True)
    out = torch.cat([response_logprobs(model, mb, temperature, remove_padding=remove_padding, sp=sp)[0]
                     for mb in parts])
    return out if order is None else out[torch.argsort(order)]


@torch.no_grad()
def logprob_diff_metrics(log_probs: torch.Tensor, batch: TensorDict) -> dict[str, float]:
    """Engine vs trainer log-probs of the sampled tokens, before any update (verl reports the same):
    near 0 when weight sync and the sampler are right; a broken sync shows here in production. With them
    the rollout_corr/ mismatch metrics (KL between the two policies, the log-perplexity gap, ...)."""
    if "rollout_log_probs" not in batch.keys():
        return {}
    mask = batch["response_mask"].bool()
    diff = (log_probs - batch["rollout_log_probs"]).abs()[mask]
    if diff.numel() == 0:
        return {}
    stats = mismatch_metrics(log_probs, batch["rollout_log_probs"], mask)
    values = torch.stack([diff.mean(), diff.max(), *stats.values()]).tolist()  # one host copy
    return dict(zip(["rollout/logprob_diff", "rollout/logprob_diff_max", *stats], values))


def loss_mode(configured: str, corr: RolloutCorrection) -> str:
    """The loss the update minimises: rollout correction's bypass with loss_type=reinforce replaces the
    configured one by -w A log pi, which is gpg's loss with the IS weights on it (verl's rule; docs/losses.md)."""
    # Config validation says so once when it applies (config/validate.py, check_rollout_correction).
    return "gpg" if corr.bypass_mode and corr.loss_type == "reinforce" else configured


class Actor:
    """Owns the sharded policy, its optimizer and scheduler; `update` runs one training step."""

    def __init__(self, role: Trained, cfg: DictConfig, temperature: float, remove_padding: bool = False,
                 correction: RolloutCorrection | None = None, sp: SequenceParallel | None = None):
        self.role, self.cfg, self.temperature, self.sp = role, cfg, temperature, sp
        self.correction = correction or RolloutCorrection()  # algorithm.rollout_correction
        self.remove_padding = remove_padding  # packed micro-batches (actor_rollout_ref.model.use_remove_padding)
        self.model, self.optimizer, self.scheduler = role.model, role.optimizer, role.scheduler  # for checkpoints
        # A user's losses register on this rank too before the first update (the driver imported them to validate).
        import_loss_module(cfg.policy_loss.get("module"))
        self.loss_mode = loss_mode(cfg.policy_loss.loss_mode, self.correction)
        self.loss_params = {k: v for k, v in cfg.policy_loss.items() if k not in ("loss_mode", "module")}

    def update(self, batch: TensorDict, retry) -> dict[str, float]:
        """ppo_epochs passes over `batch` in mini-batches, one optimizer step each (workers/update.py)."""
        # On-policy steps skip the old-log-prob pass (config/plan.py): every forward of the update
        # then runs before its one optimizer step, so its log-probs are the sampling policy's.
        on_policy = "old_log_probs" not in batch.keys()
        diffs: list[dict[str, float]] = []

        def loss_fn(micro: TensorDict, normalizer: float):
            cfg, corr, mask = self.cfg, self.correction, micro["response_mask"]
            log_probs, entropy = response_logprobs(self.model, micro, self.temperature, with_entropy=True,
                                                   remove_padding=self.remove_padding, sp=self.sp)
            old = log_probs.detach() if on_policy else micro["old_log_probs"]
            if on_policy or corr.bypass_mode:
                # Bypass runs no old-log-prob pass to measure the gap: it is measured here, on every forward
                # (after a mini-batch's optimizer step it includes the update's own move, as in verl).
                diffs.append(logprob_diff_metrics(log_probs.detach(), micro))
            stats, weights, keep = {}, None, mask.bool()
            if "rollout_log_probs" in micro.keys():
                # pi_trainer / pi_rollout: the sampling-time trainer policy (decoupled), or the current one in
                # bypass mode, where pi_old is the engine's (verl's two modes).
                trainer = log_probs.detach() if corr.bypass_mode else old
                out = apply_correction(trainer, micro["rollout_log_probs"], mask, corr)
                weights, keep, stats = out.weights, out.keep, out.metrics
            # The policy_loss group reaches the loss whole (a user's loss adds keys to it); each loss takes the
            # parameters it declares. SAPO's tau_pos/tau_neg sit on the actor, as in verl.
            out = compute_policy_loss(self.loss_mode, log_probs, old, micro["advantages"], mask,
                                      clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                                      clip_ratio_c=cfg.clip_ratio_c, rollout_is_weights=weights, keep=keep,
                                      tau_pos=cfg.tau_pos, tau_neg=cfg.tau_neg, **self.loss_params)
            token_loss = out.token_loss + entropy_bonus(entropy, mask, cfg.entropy_coeff)
            stats.update({"actor/pg_loss": masked_mean(out.token_loss.detach(), mask),
                          **entropy_metrics(entropy.detach(), mask),
                          **out.metrics, **approx_kl_metrics(log_probs.detach(), old, mask)})
            if cfg.use_kl_loss:
                kl = kl_penalty(log_probs, micro["ref_log_probs"], mask, cfg.kl_loss_type)
                token_loss = token_loss + cfg.kl_loss_coef * kl
                stats["actor/kl_loss"] = masked_mean(kl.detach(), mask)
            # A rejected token trains nothing (policy, entropy or KL term) but stays in the normaliser
            # (algos/rollout_correction.py); the policy loss already left it out of its ratios (`keep`), and
            # puts nothing there (geo_mean spreads a response's loss over its kept tokens).
            token_loss = torch.where(keep, token_loss, token_loss.new_zeros(()))
            loss = agg_loss(token_loss, mask, cfg.loss_agg_mode, normalizer=normalizer,
                            max_response_length=mask.shape[1])
            return loss, stats

        metrics = run_update(self.role, batch, loss_fn, retry)
        diffs = [d for d in diffs if d]
        # An OOM-retried attempt adds the same values again: the mean and max stand.
        for key in diffs[0] if diffs else ():
            values = [d[key] for d in diffs]
            metrics[key] = max(values) if key.endswith("_max") else sum(values) / len(values)
        return metrics
