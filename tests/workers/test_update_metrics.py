"""The update's metrics rule (workers/update.py), with a one-weight model and hand-computed numbers:
`<role>/loss` is the sum over a mini-batch's micro-batches, every other value their mean, and the
gradients add up over the micro-batches with the rank sync only on the last."""

import pytest
import torch
from tensordict import TensorDict

from logicrl.workers.oom import MicroSize
from logicrl.workers.update import Trained, _accumulate


class OneWeight(torch.nn.Linear):
    """y = w * x, recording the gradient-sync flag FSDP2 would get."""

    def __init__(self):
        super().__init__(1, 1, bias=False)
        torch.nn.init.constant_(self.weight, 0.5)
        self.synced: list[bool] = []

    def set_requires_gradient_sync(self, flag: bool) -> None:
        self.synced.append(flag)


def test_loss_sums_and_stats_average_over_micro_batches():
    model = OneWeight()
    role = Trained(name="actor", model=model, optimizer=None, scheduler=None, plan=None, loss_agg_mode="token-mean",
                   grad_clip=1.0, world_size=1, device=torch.device("cpu"))
    size = MicroSize("update_actor", "ppo_micro_batch_size_per_gpu", 2)
    mini = TensorDict({"x": torch.tensor([[1.0], [2.0], [3.0], [4.0]])}, batch_size=[4])

    def loss_fn(micro, normalizer):
        loss = model(micro["x"]).sum() / normalizer  # 0.5 * sum(x) / 10
        return loss, {"actor/x_mean": micro["x"].mean(), "actor/rows": float(len(micro))}

    out = _accumulate(role, mini, size, 10.0, loss_fn)
    # Micro-batches [1, 2] and [3, 4]: losses 0.15 and 0.35, means of x 1.5 and 3.5.
    assert out["actor/loss"] == pytest.approx(0.15 + 0.35, rel=1e-6)
    assert out["actor/x_mean"] == pytest.approx((1.5 + 3.5) / 2, rel=1e-6)
    assert out["actor/rows"] == 2.0 and all(isinstance(v, float) for v in out.values())
    assert model.synced == [False, True]
    assert model.weight.grad.item() == pytest.approx((1 + 2 + 3 + 4) / 10, rel=1e-6)  # d/dw of both losses
