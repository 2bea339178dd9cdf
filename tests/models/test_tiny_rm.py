"""The embedded reward model (embedded:tiny_rm): it builds, passes the reward-head check, its training
labels are the rule reward's scores, and its score agrees with the rule reward on held-out responses.

The checkpoint is the one main_ppo.py loads, under the default cache root ($LOGICRL_CACHE or
~/.cache/logicrl): built on first use (83 s of training on 2 idle cores), then reused.
"""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from logicrl.data.role_task import DATA_SOURCE
from logicrl.models import tiny_rm
from logicrl.models.loading import load_tokenizer
from logicrl.models.reward_head import reward_head
from logicrl.models.reward_model import load_reward_model, score_rows
from logicrl.models.spec import load_model_spec
from logicrl.models.tiny import EMBEDDED_TINY, EMBEDDED_TINY_RM, TINY_RM_CONFIG
from logicrl.reward import role
from tests.conftest import ROOT, check_main, need_data, write_jsonl

# Builds the embedded reward model (83 s of training on 2 idle cores) on first use: not a unit test.
pytestmark = pytest.mark.integration
DATA = ROOT / "data" / "kk_role"


@pytest.fixture(scope="module")
def directory(tiny_rm) -> Path:
    return tiny_rm


@pytest.fixture(scope="module")
def tokenizer(directory):
    return load_tokenizer(EMBEDDED_TINY_RM)


@pytest.fixture(scope="module")
def held_out(tokenizer):
    """The test split's prompts (never trained on), each with responses drawn as in training."""
    from logicrl.data.role_task import generate

    splits = generate(tiny_rm.PEOPLE, tiny_rm.TRAIN_PROMPTS, tiny_rm.TEST_PROMPTS, tiny_rm.DATA_SEED)
    return splits, tiny_rm.examples(splits["test"], tokenizer, tiny_rm.RESPONSES_PER_PROMPT, seed=1234)


def rule(response: str, role_name: str) -> dict:
    return role.compute_score(DATA_SOURCE, response, {"name": "x", "role": role_name})


def test_the_embedded_name_passes_the_head_check_before_and_after_the_build(directory):
    # Before: from TINY_RM_CONFIG alone, as the preflight reads it. After: from the built config.json.
    assert reward_head(EMBEDDED_TINY_RM).kind == "classifier"
    head = reward_head(str(directory))
    assert (head.kind, head.prefix, head.bias) == ("classifier", "score", False)
    built = json.loads((directory / "config.json").read_text())
    assert built["architectures"] == ["Qwen2ForSequenceClassification"]
    spec, spec_built = load_model_spec(EMBEDDED_TINY_RM), load_model_spec(str(directory))
    assert (spec.hidden_size, spec.num_layers, spec.head_dim) == (spec_built.hidden_size, spec_built.num_layers, 64)
    assert built["vocab_size"] <= TINY_RM_CONFIG["vocab_size"]
    assert directory.name == f"tiny_rm-{tiny_rm.tiny_rm_fingerprint()}"


def test_it_reads_the_actors_tokens_as_they_are(tokenizer):
    # The same tokenizer as the tiny actor: the reward worker scores the actor's rows without re-rendering.
    from logicrl.models.rm_inputs import same_tokenizer

    assert same_tokenizer(load_tokenizer(EMBEDDED_TINY), tokenizer)


def test_training_labels_are_the_rule_rewards_scores(tokenizer, held_out):
    splits, items = held_out
    trained = tiny_rm.examples(splits["train"][:100], tokenizer, tiny_rm.RESPONSES_PER_PROMPT, seed=0)
    for e in trained + items:
        assert e.rule_score == rule(e.response, e.role)["score"], e
        assert e.prefix_scores[-1] == e.rule_score
    # Every level of the rule reward is taught: right, the other role, no role.
    assert {e.rule_score for e in trained} == {1.0, 0.0, -1.0}


def test_held_out_prompts_are_make_datas_test_split(held_out):
    splits, _ = held_out
    need_data("kk_role")
    assert pq.read_table(DATA / "test.parquet").to_pylist() == splits["test"]
    key = lambda r: r["prompt"][0]["content"]  # noqa: E731
    assert not {key(r) for r in splits["test"]} & {key(r) for r in splits["train"]}


def test_score_agrees_with_the_rule_reward_on_held_out_responses(directory, tokenizer, held_out):
    # Loaded as the reward worker loads it (a token classifier read at the last real token).
    model = load_reward_model(EMBEDDED_TINY_RM, torch.float32)
    _, items = held_out
    input_ids, mask, positions = tiny_rm.batch(items, tokenizer.pad_token_id)
    scores = score_rows(model, input_ids, mask, positions, micro_batch_size=256)
    right = [rule(e.response, e.role)["acc"] == 1.0 for e in items]
    agree = [(float(s) > 0) == r for s, r in zip(scores, right)]
    share = sum(agree) / len(items)
    by_kind = {k: sum(a for i, a in enumerate(agree) if i % 4 == k) / sum(1 for i in range(len(agree)) if i % 4 == k)
               for k in range(4)}
    print(f"tiny_rm held-out agreement {share:.4f} on {len(items)} responses ({sum(right)} right); "
          f"by kind (right, other role, other word, random token) {by_kind}")
    assert share >= 0.95
    # The bare answers an actor writes most: each test prompt's two roles, then the eos.
    bare = [tiny_rm.Example(e.prompt_ids, tokenizer.encode(f" {r}", add_special_tokens=False) +
                            [tokenizer.eos_token_id], e.role, f" {r}", rule(f" {r}", e.role)["score"], ())
            for e in items[::tiny_rm.RESPONSES_PER_PROMPT] for r in ("knight", "knave")]
    bare_share = tiny_rm.agreement(tiny_rm.scores(model, bare, tokenizer.pad_token_id), bare)
    print(f"tiny_rm agreement on bare answers {bare_share:.4f} of {len(bare)}")
    assert bare_share >= 0.95
    record = json.loads((directory / tiny_rm.BUILD_RECORD).read_text())
    assert record["held_out_agreement"] >= 0.95


def test_recipe_dry_runs(tmp_path):
    # main_ppo.py's dry run in-process (check_main): a dry run's launch is tests/config/test_dry_run.py's.
    train = write_jsonl(tmp_path / "train.jsonl", 40)
    val = write_jsonl(tmp_path / "val.jsonl", 4)
    result = check_main("+recipe=tiny_rm_ppo", f"data.train_files={train}", f"data.val_files={val}",
                        "trainer.dry_run=true", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.code == 0, (result.line, result.err)
    out = result.out
    assert "algorithm  gae, rollout vllm, critic yes, reference yes" in out
    assert "reward     reward model embedded:tiny_rm, per rank 4 forwards of <= 32; reward.combine.mode=model" in out
    assert "16 prompts x n=8 = 128 responses" in out
    assert "no model was loaded" in out


@pytest.mark.slow
def test_score_agrees_with_the_rule_reward_on_the_tiny_actors_own_samples(tokenizer, held_out):
    # What PPO first shows it: the pre-trained tiny actor's responses (4 tokens at most, temperature 1)
    # to the held-out prompts, scored by the rule and by the reward model. Seeded; about 20 s.
    from logicrl.data.prompts import render_prompt
    from logicrl.models.loading import load_causal_lm

    splits, _ = held_out
    actor = load_causal_lm(EMBEDDED_TINY, torch.float32).eval()
    model = load_reward_model(EMBEDDED_TINY_RM, torch.float32)
    torch.manual_seed(0)
    items = []
    for row in splits["test"]:
        text, add_special = render_prompt(row["prompt"], tokenizer, {})
        prompt_ids = tokenizer.encode(text, add_special_tokens=add_special)
        x = torch.tensor([prompt_ids] * 4)
        with torch.no_grad():
            out = actor.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=4, do_sample=True,
                                 temperature=1.0, top_k=0, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
        for response_ids in out[:, len(prompt_ids):].tolist():
            if tokenizer.eos_token_id in response_ids:
                response_ids = response_ids[:response_ids.index(tokenizer.eos_token_id) + 1]
            response = tokenizer.decode(response_ids, skip_special_tokens=True)
            truth = row["reward_model"]["ground_truth"]
            items.append(tiny_rm.Example(prompt_ids, response_ids, truth["role"], response,
                                         rule(response, truth["role"])["score"], ()))
    share = tiny_rm.agreement(tiny_rm.scores(model, items, tokenizer.pad_token_id), items)
    right = sum(e.rule_score == 1.0 for e in items)
    print(f"tiny_rm agreement on the tiny actor's samples {share:.4f} of {len(items)} ({right} right)")
    assert share >= 0.95
