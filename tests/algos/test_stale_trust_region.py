"""Why a stale batch trains in bypass mode (config/async_training.py, docs/async.md): with one optimizer step a
step, decoupled correction's PPO ratio is pi_theta over the trainer's own policy at the update's start, 1, so
nothing is ever clipped, however far the previous update moved a token from the engine that sampled it. Bypass
takes the ratio against that engine and clips it. Inside the clip band the two give the same gradient.

One token, its log-prob under the trainer, the engine's, an advantage; the actor's composition
(workers/actor.py: decoupled takes its own detached forward as old, bypass the engine's). Hand-derived:
d loss / d log pi = -A w r with r = pi / pi_old where unclipped, 0 where the clip holds the loss constant.
"""

import math

import pytest
import torch

from logicrl.algos import RolloutCorrection, apply_correction, compute_policy_loss

DECOUPLED = RolloutCorrection(rollout_is="token", rollout_is_threshold=2.0)
BYPASS = RolloutCorrection(rollout_is="token", rollout_is_threshold=2.0, bypass_mode=True)


def gradient(p_trainer: float, p_engine: float, advantage: float, corr: RolloutCorrection) -> float:
    """d loss / d log pi of the token, as the actor's loss computes it on a step of one optimizer step."""
    log_p = torch.tensor([[math.log(p_trainer)]], requires_grad=True)
    engine = torch.tensor([[math.log(p_engine)]])
    mask = torch.ones(1, 1)
    old = engine if corr.bypass_mode else log_p.detach()
    out = apply_correction(log_p.detach() if corr.bypass_mode else old, engine, mask, corr)
    loss = compute_policy_loss("vanilla", log_p, old, torch.full((1, 1), advantage), mask, clip_ratio_low=0.2,
                               clip_ratio_high=0.2, rollout_is_weights=out.weights, keep=out.keep).token_loss.sum()
    loss.backward()
    return float(log_p.grad)


@pytest.mark.parametrize("p_trainer, advantage, decoupled, bypass", [
    # The previous update raised a good token from 0.5 to 0.8: decoupled pushes it on with w = 1.6;
    # bypass's r = 1.6 is past 1.2, the loss is -1.2 A, constant.
    (0.8, 1.0, -1.6, 0.0),
    # It lowered a bad token from 0.5 to 0.3: decoupled pushes it down again with w = 0.6; bypass's r = 0.6 is
    # under 0.8, the loss is 0.8 |A|, constant.
    (0.3, -1.0, 0.6, 0.0),
    # Within the band (r = 1.1) both are the IS-weighted policy gradient, -A r.
    (0.55, 1.0, -1.1, -1.1),
])
def test_decoupled_correction_clips_nothing_in_one_step_and_bypass_clips_against_the_engine(
        p_trainer, advantage, decoupled, bypass):
    assert gradient(p_trainer, 0.5, advantage, DECOUPLED) == pytest.approx(decoupled, rel=1e-6)
    assert gradient(p_trainer, 0.5, advantage, BYPASS) == pytest.approx(bypass, abs=1e-7)
