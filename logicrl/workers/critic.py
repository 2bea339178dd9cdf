"""The FSDP2 critic (GAE): values of response positions, and the clipped value-loss update.

The value of response token j is read at the position that predicts it (the hidden state just
before it), like the policy's log-prob, so V and log pi score the same state.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig
from tensordict import TensorDict

from logicrl.algos import agg_loss, loss_normalizer, masked_mean, value_loss
from logicrl.workers.fsdp import all_reduce_sum, clip_grad_norm, drop_unreduced_grads
from logicrl.trainer.faults import maybe_fail
from logicrl.workers.micro import split_fixed
from logicrl.workers.oom import MicroSize, retry_on_oom


def response_values(model, batch: TensorDict) -> torch.Tensor:
    """[N, R] values of the response positions, fp32."""
    r = batch["responses"].shape[1]
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False)
    return out.logits[:, -r - 1:-1, 0].float()


class Critic:
    def __init__(self, model, optimizer, scheduler, cfg: DictConfig, device: torch.device, world_size: int):
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.cfg, self.device, self.world_size = cfg, device, world_size
        self.micro_size = MicroSize.from_config("update_critic", "critic", cfg, cfg.use_dynamic_bsz,
                                                "ppo_micro_batch_size_per_gpu", "ppo_max_token_len_per_gpu")
        self.calls = 0  # update() calls, for fault injection

    @torch.no_grad()
    def compute_values(self, batch: TensorDict, micro: int) -> torch.Tensor:
        self.model.eval()
        return torch.cat([response_values(self.model, mb) for mb in split_fixed(batch, micro)])

    def update(self, batch: TensorDict, per_rank_mini: int, loss_agg_mode: str) -> dict[str, float]:
        cfg = self.cfg
        self.model.train()
        self.calls += 1
        records: dict[str, list[float]] = {}
        for _ in range(cfg.ppo_epochs):
            for mini in split_fixed(batch, per_rank_mini):
                normalizer = all_reduce_sum(float(loss_normalizer(mini["response_mask"], loss_agg_mode)),
                                            self.device)
                # An OOM drops the attempt's gradients and re-runs the mini-batch with half the split.
                stats = retry_on_oom(self.micro_size, lambda _: self._accumulate(mini, normalizer, loss_agg_mode),
                                     self.device, reset=lambda: drop_unreduced_grads(self.model))
                for key, values in stats.items():
                    records.setdefault(key, []).extend(values)
                grad_norm = clip_grad_norm(self.model, cfg.grad_clip)
                if torch.isfinite(torch.tensor(grad_norm)):
                    self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                records.setdefault("critic/grad_norm", []).append(grad_norm)
        self.scheduler.step()
        metrics = {k: sum(v) / len(v) for k, v in records.items()}
        metrics["perf/oom_retries/update_critic"] = self.micro_size.retries
        metrics["perf/micro_size/update_critic"] = self.micro_size.value
        return metrics

    def _accumulate(self, mini: TensorDict, normalizer: float, loss_agg_mode: str) -> dict[str, list]:
        cfg = self.cfg
        micro_batches = self.micro_size.split(mini, self.device)
        records: dict[str, list[float]] = {}
        for i, micro in enumerate(micro_batches):
            self.model.set_requires_gradient_sync(i == len(micro_batches) - 1)
            if i == len(micro_batches) - 1:
                maybe_fail("update_critic", self.calls, kinds=("oom",))  # fault injection (tests)
            mask = micro["response_mask"]
            values = response_values(self.model, micro)
            out = value_loss(values, micro["values"], micro["returns"], mask, cfg.cliprange_value)
            loss = agg_loss(out.token_loss, mask, loss_agg_mode, normalizer=normalizer,
                            max_response_length=mask.shape[1])
            (loss * self.world_size).backward()
            records.setdefault("critic/vf_loss", []).append(float(masked_mean(out.token_loss.detach(), mask)))
            records.setdefault("critic/vf_clipfrac", []).append(float(masked_mean(out.clipped.float(), mask)))
        return records
