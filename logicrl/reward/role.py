"""Reward of the embedded default's recall task (logicrl/data/role_task.py).

The response continues "<Name> is a"; its first word is the answer:

    score   +1 the right role, 0 the other role, -1 anything else (no answer)
    acc     1 for the right role, else 0

A guess must pay better than silence, as in Logic-RL's reward (wrong -1.5 > unparsed -2):
with wrong and silent scored alike, a policy that cannot yet tell the roles apart drifts to
saying neither. Chance, for a model that says a role word without reading the prompt: acc
0.5, score 0.5. Maximum: acc 1, score 1. What follows the first word is not scored. Total:
any string gives a score.
"""

from __future__ import annotations

from logicrl.data.role_task import ROLES, answer_word


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    role = ground_truth.get("role") if isinstance(ground_truth, dict) else None
    if role not in ROLES:
        # A ground truth no response can match would train on -1 and 0 forever: a data bug.
        raise ValueError(f"kk_role ground truth must be {{'role': one of {list(ROLES)}, ...}}, "
                         f"got {ground_truth!r:.80}")
    first = answer_word(solution_str)
    score = 1.0 if first == role else 0.0 if first in ROLES else -1.0
    return {"score": score, "acc": float(first == role)}
