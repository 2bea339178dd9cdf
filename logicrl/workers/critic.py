"""The FSDP2 critic (GAE): values of response positions, and the clipped value loss its update minimises.

The value of response token j is read at the position that predicts it (the hidden state just
before it), like the policy's log-prob, so V and log pi score the same state.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from logicrl.algos import agg_loss, masked_mean, value_clip_metrics, value_loss
from logicrl.models.packing import pack
from logicrl.models.ulysses import SequenceParallel, gather_tokens, local_positions, sp_forward
from logicrl.workers.oom import MicroSize
from logicrl.workers.update import Trained, run_update


def response_values(model, batch: TensorDict, remove_padding: bool = False,
                    sp: SequenceParallel | None = None) -> torch.Tensor:
    """[N, R] values of the response positions, fp32. With `remove_padding` the forward runs on
    the real tokens packed into one row (models/packing.py) and padded positions hold 0. With `sp`
    (needs `remove_padding`) this rank runs its 1/S of that row and the group sums the pieces
    (models/ulysses.py)."""
    r = batch["responses"].shape[1]
    if sp is not None:
        if not remove_padding:
            raise ValueError("sequence parallelism runs on packed rows: set critic.model.use_remove_padding=true")
        packed = pack(batch["input_ids"], batch["attention_mask"], batch["position_ids"], r)
        out, start, stop = sp_forward(model, packed.input_ids, packed.position_ids, sp, use_cache=False)
        local = out.logits[0, local_positions(packed.score_index, start, stop), 0].float()
        return packed.unpack(gather_tokens(local, packed.score_index, start, stop, sp))
    if remove_padding:
        packed = pack(batch["input_ids"], batch["attention_mask"], batch["position_ids"], r)
        out = model(input_ids=packed.input_ids, attention_mask=None, position_ids=packed.position_ids,
                    use_cache=False)
        return packed.unpack(out.logits[0, packed.score_index, 0].float())
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False)
    return out.logits[:, -r - 1:-1, 0].float()


class Critic:
    def __init__(self, role: Trained, cliprange_value: float, remove_padding: bool = False,
                 sp: SequenceParallel | None = None):
        self.role, self.cliprange_value, self.remove_padding, self.sp = role, cliprange_value, remove_padding, sp
        self.model, self.optimizer, self.scheduler = role.model, role.optimizer, role.scheduler  # for checkpoints

    @torch.no_grad()
    def compute_values(self, batch: TensorDict, size: MicroSize) -> torch.Tensor:
        """[N, R] values of a rank's batch, split as `size` says, rows back in the batch's order
        (as workers/actor.py forward_logprobs)."""
        self.model.eval()
        parts, order = size.split(batch, batch.device, with_index=True)
        out = torch.cat([response_values(self.model, mb, self.remove_padding, self.sp) for mb in parts])
        return out if order is None else out[torch.argsort(order)]

    def update(self, batch: TensorDict, retry) -> dict[str, float]:
        def loss_fn(micro: TensorDict, normalizer: float):
            mask = micro["response_mask"]
            out = value_loss(response_values(self.model, micro, self.remove_padding, self.sp), micro["values"],
                             micro["returns"], mask, self.cliprange_value)
            loss = agg_loss(out.token_loss, mask, self.role.loss_agg_mode, normalizer=normalizer,
                            max_response_length=mask.shape[1])
            return loss, {"critic/vf_loss": masked_mean(out.token_loss.detach(), mask),
                          **value_clip_metrics(out.clipped, mask)}

        return run_update(self.role, batch, loss_fn, retry)
