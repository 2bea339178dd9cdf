"""A task the embedded tiny model can only solve with its tool ("kk_role_tool"): look up a role, then say it.

The kk_role prompt (data/role_task.py) without the sentence that states the role: only the `lookup` tool
(recipes/tools/lookup.py) knows it, from the row's `extra_info.tools_kwargs`. The assistant turn opens with the
call written inside answer tags (after `</answer>` the tiny model sometimes ends its turn, after a bare
`</tool_call>` never), so the model learns to end the turn there, then read the answer and name the role.
Reward: reward/role_tool.py; the conversation and what was measured: docs/multi_turn.md ("The demo").

    python -m logicrl.data.role_tool_task --people 3 --train-size 2000 --test-size 200 --out data/kk_role_tool
"""

from __future__ import annotations

import json
import sys

import numpy as np

from logicrl.data.kk.render import NAMES
from logicrl.data.role_task import INTRO, ROLES, _listing, run_cli

DATA_SOURCE = "kk_role_tool"
TOOL = "lookup"


def tool_answer(name: str, role: str) -> str:
    """What the lookup tool says of an islander it knows; the reward reads what the model wrote after it."""
    return f"{name} is a {role}."


def make_row(names: list[str], role: str, asked: int, split: str, index: int) -> dict:
    who = names[asked]
    call = json.dumps({"name": TOOL, "arguments": {"name": who}})
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{INTRO} You meet {_listing(names)}. Which one is {who}? Look it up."},
                   {"role": "assistant", "content": f"<answer><tool_call>{call}</tool_call></answer>"}],
        "ability": "tool use",
        "reward_model": {"style": "rule", "ground_truth": {"name": who, "role": role}},
        # verl's per-row tool arguments: the lookup tool gets the roles this row's islanders have.
        "extra_info": {"split": split, "index": index, "n_people": len(names),
                       "tools_kwargs": {TOOL: {"execute_kwargs": {"roles": {who: role}}}}},
    }


def generate(people: int, train_size: int, test_size: int, seed: int = 0) -> dict[str, list[dict]]:
    """Train and test rows that never share a (names, role, asked) triple."""
    rng = np.random.default_rng(seed)
    seen: set[tuple] = set()
    splits: dict[str, list[dict]] = {"test": [], "train": []}
    for split, size in (("test", test_size), ("train", train_size)):
        for _ in range(100 * size):
            if len(splits[split]) == size:
                break
            names = [NAMES[i] for i in rng.choice(len(NAMES), size=people, replace=False)]
            role, asked = ROLES[int(rng.integers(0, 2))], int(rng.integers(0, people))
            if (key := (tuple(names), role, asked)) not in seen:
                seen.add(key)
                splits[split].append(make_row(names, role, asked, split, len(splits[split])))
        if len(splits[split]) < size:
            raise ValueError(f"only {len(splits[split])} distinct {split} prompts for {people} people: ask for fewer")
    return splits


def main(argv: list[str] | None = None) -> int:
    return run_cli("python -m logicrl.data.role_tool_task", __doc__, DATA_SOURCE, generate, argv)


if __name__ == "__main__":
    sys.exit(main())
