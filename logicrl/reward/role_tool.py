"""Reward of the tool demo (logicrl/data/role_tool_task.py): the role named after the lookup tool's answer.

    score   +1 the right role, 0 the other role, -1 no role word after the tool's answer
    acc     1 for the right role, else 0

The answer is the first role word the model wrote after the tool's answer ("Noah is a knight."). A response
the tool never answered (multi_turn.enable=false, or a first turn that never ended) has no answer, whatever
role it guessed: the task is to look the role up, and a guess scored at its 50% would pay as well as the
lookup while the model cannot yet read the answer, so nothing would favour calling the tool. The tool's own
words never count, nor do the model's own: the tool's answer is found where a line starts with it, as chat
templates render a tool message (the last occurrence would be the model's verbatim copy of the sentence, and
a copy would score as no answer). Total: any string gives a score.
"""

from __future__ import annotations

import re

from logicrl.data.role_task import ROLES
from logicrl.data.role_tool_task import tool_answer

_ROLE = re.compile(r"\b(knight|knave)\b")


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    name = ground_truth.get("name") if isinstance(ground_truth, dict) else None
    role = ground_truth.get("role") if isinstance(ground_truth, dict) else None
    if role not in ROLES or not isinstance(name, str):
        raise ValueError(f"kk_role_tool ground truth must be {{'name': str, 'role': one of {list(ROLES)}}}, "
                         f"got {ground_truth!r:.80}")
    text = str(solution_str)
    answered = "\n" + tool_answer(name, role)
    after = text.split(answered, 1)[1] if answered in text else ""
    match = _ROLE.search(after.lower())
    said = match.group(1) if match else ""
    score = 1.0 if said == role else 0.0 if said else -1.0
    return {"score": score, "acc": float(said == role), "tool_answered": float(answered in text)}
