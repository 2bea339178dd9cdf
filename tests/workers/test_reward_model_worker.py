"""The hybrid worker's reward_model phase on two gloo ranks scores each row as a direct HF forward of the
same sequence classifier on the same tokens (fp32, atol 1e-5): padded, packed (use_remove_padding, split
by a token budget), and re-rendered for a reward tokenizer with its own chat template. In the padded
case an out-of-memory error is injected on both ranks: the phase halves its micro-batch, re-runs and
gives the same scores (workers/oom.py).

The batch is what the controller sends after generation: real kk_role prompts (left-padded, each
repeated twice) and responses of 1..6 ordinary tokens (right-padded), cut into two shards with the
prompts' chats kept (trainer/batch.py shards(keep=("raw_prompt",))). Each rank scores its shard; the
test puts the shards back in order and compares with transformers' own classifier, row by row, on the
row's real tokens alone (no padding to get wrong).
"""

import pytest
import torch
import transformers
from omegaconf import OmegaConf

from logicrl.controller.ports import free_port
from tests.conftest import ROOT
from tests.helpers.spawn import spawn
from tests.workers.conftest import PLAIN_TEMPLATE, leave_group, write_tiny_reward_model

pytestmark = pytest.mark.integration
WORLD, ARR, R = 2, "actor_rollout_ref", 6
DATA = ROOT / "data/kk_role"


def step_batch(tokenizer):
    """8 rows as after generate: 4 prompts x 2, responses of 1..6 tokens drawn from ids 3..700 (no specials),
    each response's second token attended but not trained (as tool output would be): the reward model
    reads the whole response."""
    from logicrl.data.dataset import load_prompts
    from logicrl.trainer.batch import prompt_batch

    rows = load_prompts(str(DATA / "train.parquet"), tokenizer, max_prompt_length=128).rows[:4]
    batch = prompt_batch(rows, 2, tokenizer.pad_token_id)
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([1, 6, 3, 5, 2, 6, 4, 1])
    attended = (torch.arange(R)[None] < lengths[:, None]).long()
    responses = torch.randint(3, 700, (len(batch), R), generator=g) * attended
    responses[attended == 0] = tokenizer.pad_token_id
    attention_mask = torch.cat([batch["attention_mask"], attended], dim=1)
    batch["input_ids"] = torch.cat([batch["input_ids"], responses], dim=1)
    batch["attention_mask"] = attention_mask
    batch["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    batch["responses"], batch["response_attention_mask"] = responses, attended
    batch["response_mask"] = attended.clone()
    batch["response_mask"][:, 1] = 0
    return batch


def overrides(rm_path, *extra):
    return [f"data.train_files={DATA}/train.parquet", f"data.val_files={DATA}/test.parquet",
            "data.train_batch_size=4", f"{ARR}.rollout.n=2", f"{ARR}.actor.ppo_mini_batch_size=4",
            f"data.max_response_length={R}", f"{ARR}.rollout.name=hf", "trainer.n_gpus=2",
            "reward_model.enable=true", f"reward_model.model.path={rm_path}", *extra]


def _rank(rank: int, port: int, cases: dict, out: str):
    from logicrl.config import compose, validate
    from logicrl.faults import Faults, parse
    from logicrl.models.loading import load_tokenizer
    from logicrl.trainer.batch import shards
    from logicrl.workers.hybrid import HybridWorker

    torch.set_num_threads(1)
    results = {}
    for name, (case_overrides, fault) in cases.items():
        cfg, _, plan = validate(compose(case_overrides))
        worker = HybridWorker(OmegaConf.to_container(cfg, resolve=True), plan, rank, WORLD, "127.0.0.1", port,
                              faults=Faults(parse(fault)))
        batch = step_batch(load_tokenizer(cfg[ARR].model.path, quiet=True))
        shard = shards(batch, WORLD, keep=("raw_prompt",))[rank]
        out_td, metrics = worker.run(shard, "reward_model", step=1)
        results[name] = dict(scores=out_td["rm_scores"], metrics=metrics,
                             retokenized=worker.rm_tokenizers is not None,
                             resharded=hasattr(worker.reward_model.get_input_embeddings().weight, "to_local"))
    torch.save(results, f"{out}/rank{rank}.pt")
    leave_group()


def direct_scores(rm_path, token_rows):
    """transformers' sequence classifier on each row's tokens alone (one row: its last token is read)."""
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(rm_path, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.stack([hf(input_ids=torch.tensor(ids)[None]).logits[0, 0] for ids in token_rows])


def test_worker_scores_equal_a_direct_hf_forward(kk_role, tmp_path):
    from logicrl.models.loading import load_tokenizer

    same = write_tiny_reward_model(tmp_path / "rm")
    own = write_tiny_reward_model(tmp_path / "rm-own-template", chat_template=PLAIN_TEMPLATE)
    cases = {
        # 3 + 1 rows per rank; the injected OOM halves it to 1 row per forward
        "padded": (overrides(same, "reward_model.model.use_remove_padding=false",
                             "reward_model.micro_batch_size_per_gpu=3"), "oom@reward_model:1"),
        # several budgets per rank, rows reordered across them
        "packed": (overrides(same, "reward_model.model.use_remove_padding=true", "reward_model.use_dynamic_bsz=true",
                             "reward_model.forward_max_token_len_per_gpu=80"), ""),
        "retokenized": (overrides(own, "reward_model.model.use_remove_padding=false"), ""),
    }
    spawn(_rank, args=(free_port(), cases, str(tmp_path)), nprocs=WORLD)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]

    actor = load_tokenizer("embedded:tiny", quiet=True)
    batch = step_batch(actor)
    actor_rows = [ids[m.bool()].tolist() for ids, m in zip(batch["input_ids"], batch["attention_mask"])]
    expected = direct_scores(same, actor_rows)
    assert expected.std() > 0.1  # the rows really score differently
    for name in ("padded", "packed"):
        got = torch.cat([r[name]["scores"] for r in ranks])
        assert not ranks[0][name]["retokenized"]  # the same tokenizer: the actor's tokens as they are
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

    # Its own template: each chat (ending with the opened assistant turn "Joseph is a") continued by the
    # decoded response, rendered by the reward tokenizer, tokenized without added specials.
    rm_tok = transformers.AutoTokenizer.from_pretrained(own)
    texts = []
    for chat, response, mask in zip(batch["raw_prompt"], batch["responses"], batch["response_attention_mask"]):
        chat = [dict(m) for m in chat]
        assert chat[-1]["role"] == "assistant"
        chat[-1]["content"] += actor.decode(response[mask.bool()].tolist(), skip_special_tokens=False)
        texts.append(rm_tok.apply_chat_template(chat, tokenize=False))
    assert texts[0].startswith("user: Knights")
    expected = direct_scores(own, [rm_tok(t, add_special_tokens=False)["input_ids"] for t in texts])
    got = torch.cat([r["retokenized"]["scores"] for r in ranks])
    assert ranks[0]["retokenized"]["retokenized"]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)

    for r in ranks:
        for case in r.values():
            assert case["resharded"]  # the frozen model holds only its shards after its forward
            m = case["metrics"]
            assert "timing_s/reward_model" in m and "perf/memory/reward_model/rss_peak_gb" in m
        assert (r["padded"]["metrics"]["perf/oom_retries/reward_model"], r["padded"]["metrics"][
            "perf/micro_size/reward_model"]) == (1, 1)
        assert r["retokenized"]["metrics"]["perf/oom_retries/reward_model"] == 0
    assert ranks[0]["retokenized"]["metrics"]["reward_model/truncated"] == 0
