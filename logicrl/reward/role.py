"""Reward of the embedded default's recall task (logicrl/data/role_task.py).

The response continues "<Name> is a". Its words are scored one by one: +1 for the right role
word, -1 for the other role word, 0 for anything else, averaged over the words, so

    score   in [-1, 1]: 1 for a response that is only the right role ("knave" then EOS), about 0
            for random text (chance: a role word is 2 of the tiny tokenizer's 763 tokens)
    acc     1 when the first word is the right role, else 0 (the answer as a reader sees it)

Averaging rather than counting keeps long random responses from scoring by volume. Total: any
string gives a score.
"""

from __future__ import annotations

import re

from logicrl.data.role_task import ROLES

_WORD = re.compile(r"[a-z]+")


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> dict:
    role = ground_truth["role"]
    other = ROLES[1 - ROLES.index(role)]
    words = _WORD.findall(str(solution_str).lower())
    if not words:
        return {"score": 0.0, "acc": 0.0}
    score = (words.count(role) - words.count(other)) / len(words)
    return {"score": score, "acc": float(words[0] == role)}
