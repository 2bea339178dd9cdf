"""A response with a span in its middle that the model attends to but does not train on (attention 1,
loss 0: how tool output will look). It has the same length and reward position as the response trained
whole, the same log-probs and values for every token (the model still sees the span), and its tokens
carry no gradient: whatever the batch holds there, the actor's and the critic's updates are unchanged.

The batches come from the worker's generate phase fed by a scripted engine, so what the forwards read
(attention mask, positions) is what the worker builds from the engine's two masks.
"""

from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import NonTensorStack, TensorDict

from logicrl.algos import ADV_ESTIMATORS, RolloutCorrection, compute_advantage
from logicrl.algos.masked import response_lengths
from logicrl.config.plan import Micro, Update
from logicrl.models.loading import load_tokenizer
from logicrl.models.reward_model import token_level_scores
from logicrl.models.rm_inputs import response_text
from logicrl.trainer.batch import length_metrics
from logicrl.trainer.rewards import RewardManager
from logicrl.trainer.step_perf import generation_round
from logicrl.workers import actor as actor_module
from logicrl.workers import critic as critic_module
from logicrl.workers.actor import Actor, response_logprobs
from logicrl.workers.critic import Critic, response_values
from logicrl.workers.fsdp import build_optimizer
from logicrl.workers.hybrid import HybridWorker
from logicrl.workers.oom import MicroSize
from logicrl.workers.rollout import RolloutOutput
from logicrl.workers.update import Trained
from tests.workers.conftest import build_tiny_qwen2, left_padded

PROMPTS = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15], [16, 17]]
LENGTHS = [8, 6, 7, 5]  # where each response ends; R = 8, so row 0 reaches the budget
R = 8
SPAN = slice(2, 5)  # columns 2..4: inside every response, with trained tokens on both sides
ACTOR_CFG = dict(loss_agg_mode="token-mean", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
                 tau_pos=1.0, tau_neg=1.05, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.1,
                 kl_loss_type="low_var_kl",
                 policy_loss={"loss_mode": "vanilla", "clip_cov_ratio": 2e-4, "clip_cov_lb": 1.0, "clip_cov_ub": 5.0,
                              "kl_cov_ratio": 2e-4, "ppo_kl_coef": 0.1})


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("embedded:tiny", quiet=True)


class ScriptedEngine:
    """Returns one fixed RolloutOutput, as an engine schedules its own batches (no micro-batch)."""

    micro_batch_size = None
    weights_valid = True

    def __init__(self, out: RolloutOutput):
        self.out = out

    def generate(self, input_ids, attention_mask, params, micro_batch_size=None):
        return self.out


def rollout(pad_id: int, holed: bool) -> TensorDict:
    """The worker's generate phase on PROMPTS, the engine answering LENGTHS tokens per row; with `holed`
    the SPAN's tokens are attended but not trained."""
    g = torch.Generator().manual_seed(0)
    attended = (torch.arange(R)[None] < torch.tensor(LENGTHS)[:, None]).long()  # [4, R]
    responses = torch.where(attended.bool(), torch.randint(3, 700, (len(LENGTHS), R), generator=g), pad_id)
    trained = attended.clone()
    if holed:
        trained[:, SPAN] = 0
    engine_logprobs = -torch.rand(len(LENGTHS), R, generator=g) * trained
    out = RolloutOutput(responses=responses, response_attention_mask=attended, response_mask=trained,
                        log_probs=engine_logprobs)
    worker = SimpleNamespace(engine=ScriptedEngine(out), rank=0, device=torch.device("cpu"),
                             cfg=OmegaConf.create({"actor_rollout_ref": {"rollout": {"free_cache_engine": False}}}))
    ids, mask = left_padded(PROMPTS, 1, pad_id)
    batch, _ = HybridWorker._generate(worker, TensorDict({"input_ids": ids, "attention_mask": mask},
                                                         batch_size=[len(PROMPTS)]), None, {"max_tokens": R})
    return batch


@pytest.fixture(scope="module")
def batches(tokenizer):
    return rollout(tokenizer.pad_token_id, holed=False), rollout(tokenizer.pad_token_id, holed=True)


def test_the_worker_builds_attention_and_positions_from_the_attention_mask(batches):
    whole, holed = batches
    for key in ("input_ids", "attention_mask", "position_ids", "responses", "response_attention_mask"):
        assert torch.equal(holed[key], whole[key]), key
    # The span is in the sequence with its own positions: the prompt's last position + 3..5.
    last_prompt = holed["position_ids"][:, 3]
    assert holed["position_ids"][:, 4 + 2:4 + 5].tolist() == [[p + 3, p + 4, p + 5] for p in last_prompt.tolist()]
    # The premise: only the loss mask has the hole, and counting it would shorten every response by 3.
    assert (holed["response_mask"] != whole["response_mask"]).nonzero()[:, 1].unique().tolist() == [2, 3, 4]
    assert holed["response_mask"].sum(-1).tolist() == [n - 3 for n in LENGTHS]


def test_length_and_reward_position_come_from_where_the_response_ends(batches, tokenizer):
    whole, holed = batches
    attention = holed["response_attention_mask"]
    assert response_lengths(attention).tolist() == LENGTHS
    assert response_lengths(torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])).tolist() == [2, 0, 4]
    out = RolloutOutput(responses=holed["responses"], response_attention_mask=attention,
                        response_mask=holed["response_mask"], log_probs=torch.zeros(4, R))
    assert out.response_lengths.tolist() == LENGTHS

    # The rule reward: the decoded text runs to the end (the span included), and the score with the
    # overlong penalty sits on the last trained token: the last one, except in row 3, which ends inside the
    # span (at 4) and has its score on 1. Buffer 4 of R = 8: lengths 8, 6, 7, 5 exceed 4 by 4, 2, 3, 1.
    def constant(data_source, solution_str, ground_truth, extra_info):
        return {"score": 2.0}

    rewards = RewardManager(tokenizer, custom_fn=constant, overlong={"len": 4, "penalty_factor": 1.0})
    rows = {"data_source": NonTensorStack.from_list(["kk_logic"] * 4),
            "ground_truth": NonTensorStack.from_list([{}] * 4), "extra_info": NonTensorStack.from_list([{}] * 4)}
    scores, metrics, texts, _ = rewards(TensorDict({**holed.to_dict(), **rows}, batch_size=[4]))
    expected = torch.zeros(4, R)
    expected[torch.arange(4), torch.tensor([7, 5, 6, 1])] = torch.tensor([2 - 1.0, 2 - 0.5, 2 - 0.75, 2 - 0.25])
    assert torch.equal(scores, expected)
    assert metrics["reward/overlong_penalty/mean"] == pytest.approx(-(1.0 + 0.5 + 0.75 + 0.25) / 4)
    assert texts == [tokenizer.decode(r[:n].tolist(), skip_special_tokens=True)
                     for r, n in zip(holed["responses"], LENGTHS)]
    same, _, same_texts, _ = rewards(TensorDict({**whole.to_dict(), **rows}, batch_size=[4]))
    assert torch.equal(same.sum(-1), scores.sum(-1)) and same_texts == texts
    assert same.nonzero()[:, 1].tolist() == [n - 1 for n in LENGTHS]  # without the hole: the last tokens

    # The learned reward's token, and the text a reward model with its own tokenizer reads.
    learned = token_level_scores(torch.tensor([1.0, 2.0, 3.0, 4.0]), attention)
    assert learned.nonzero()[:, 1].tolist() == [n - 1 for n in LENGTHS]
    text = response_text(holed["responses"][1], attention[1], tokenizer)
    assert text == tokenizer.decode(holed["responses"][1, :6].tolist()).replace(tokenizer.eos_token, "")

    # response_length/* count the sampled tokens (8, 6, 7, 5 less the span's 3); the clip ratio is where the
    # responses end: row 0 reached the budget R. Without the span, verl's numbers.
    assert length_metrics(attention, holed["response_mask"], R) == {
        "response_length/mean": 3.5, "response_length/max": 5.0, "response_length/min": 2.0,
        "response_length/clip_ratio": 0.25}
    assert length_metrics(attention, whole["response_mask"], R) == {
        "response_length/mean": 6.5, "response_length/max": 8.0, "response_length/min": 5.0,
        "response_length/clip_ratio": 0.25}
    # The step's generation round (each rank's tokens, every length) counts where the responses end.
    assert generation_round(attention, 2) == ([14, 12], LENGTHS)


def test_a_trained_token_the_model_does_not_attend_to_is_refused():
    attended = torch.tensor([[1, 1, 0]])
    with pytest.raises(ValueError, match="every trained token must be one the model attends to"):
        RolloutOutput(responses=torch.zeros(1, 3, dtype=torch.long), response_attention_mask=attended,
                      response_mask=torch.tensor([[1, 1, 1]]), log_probs=torch.zeros(1, 3))


@pytest.mark.parametrize("remove_padding", [False, True], ids=["padded", "packed"])
def test_every_token_keeps_its_log_prob_and_value_because_the_span_is_attended(batches, remove_padding):
    whole, holed = batches
    model = build_tiny_qwen2().eval()
    with torch.no_grad():
        lp, _ = response_logprobs(model, holed, 1.0, remove_padding=remove_padding)
        lp_whole, _ = response_logprobs(model, whole, 1.0, remove_padding=remove_padding)
        values = response_values(model, holed, remove_padding)
        values_whole = response_values(model, whole, remove_padding)
        # What dropping the span from attention (the loss mask read as the attention mask) would give.
        blind = holed.clone()
        blind["attention_mask"][:, 4:] = blind["response_mask"]
        blind["position_ids"] = (blind["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        lp_blind, _ = response_logprobs(model, blind, 1.0, remove_padding=remove_padding)
    attended = holed["response_attention_mask"].bool()
    assert torch.equal(lp[attended], lp_whole[attended]) and torch.equal(values[attended], values_whole[attended])
    after = holed["response_mask"].bool() & (torch.arange(R) >= SPAN.stop)  # trained tokens after the span
    assert (lp[after] - lp_blind[after]).abs().min() > 1e-4  # each of them sees the span


def update_role(name: str) -> Trained:
    model = build_tiny_qwen2(seed=1)
    model.set_requires_gradient_sync = lambda flag: None  # FSDP2's call; one plain rank has nothing to sync
    _, scheduler = build_optimizer(model, 1e-2, 0.0, 10, 0.0, "constant")
    # Plain SGD with lr 1: the step is minus the gradient, so equal weights after mean equal gradients.
    plan = Update(mini_prompts=4, per_rank_mini=4, micro=Micro("ppo_micro_batch_size_per_gpu", 4), ppo_epochs=1,
                  num_mini=1)
    return Trained(name=name, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), scheduler=scheduler,
                   plan=plan, loss_agg_mode="token-mean", grad_clip=1e9, world_size=1, device=torch.device("cpu"))


def retry(attempt, reset=None):
    return attempt(MicroSize("update_actor", "ppo_micro_batch_size_per_gpu", 4))  # one micro-batch


def with_training_fields(batch: TensorDict, garbage: bool) -> TensorDict:
    """The update's inputs; with `garbage`, large finite nonsense in the SPAN of every one of them. Old
    log-probs and values are near the model's own, so no trained token is clipped out of the gradient."""
    g = torch.Generator().manual_seed(1)
    batch = batch.clone()
    shape = batch["responses"].shape
    with torch.no_grad():
        model = update_role("actor").model
        own, _ = response_logprobs(model, batch, 1.0)
        own_values = response_values(model, batch)

    def near(x):
        return x + 0.05 * torch.randn(shape, generator=g)

    fields = {"advantages": torch.randn(shape, generator=g), "old_log_probs": near(own), "ref_log_probs": near(own),
              "rollout_log_probs": near(own), "values": near(own_values), "returns": torch.randn(shape, generator=g)}
    for name, value in fields.items():
        if garbage:
            value[:, SPAN] = torch.tensor([40.0, -60.0, 25.0])
        batch[name] = value
    return batch


def test_the_span_trains_nothing_in_the_actor_and_the_critic(batches, monkeypatch):
    whole, holed = batches
    spied = []

    def spy(real):
        def forward(*args, **kwargs):
            out = real(*args, **kwargs)
            first = out[0] if isinstance(out, tuple) else out
            first.retain_grad()
            spied.append(first)
            return out
        return forward

    monkeypatch.setattr(actor_module, "response_logprobs", spy(actor_module.response_logprobs))
    monkeypatch.setattr(critic_module, "response_values", spy(critic_module.response_values))
    cfg = OmegaConf.create(ACTOR_CFG)
    correction = RolloutCorrection(rollout_is="token", rollout_is_threshold=2.0)

    def updated(batch: TensorDict) -> dict[str, torch.Tensor]:
        actor, critic = update_role("actor"), update_role("critic")
        Actor(actor, cfg, 1.0, correction=correction).update(batch, retry)
        Critic(critic, cliprange_value=0.5).update(batch, retry)
        return {f"{role.name}.{k}": v.detach().clone() for role in (actor, critic)
                for k, v in role.model.named_parameters()}

    clean = updated(with_training_fields(holed, garbage=False))
    grads = [t.grad for t in spied]
    spied.clear()
    dirty = updated(with_training_fields(holed, garbage=True))
    for key in clean:
        torch.testing.assert_close(dirty[key], clean[key], rtol=0, atol=0, msg=key)
    # The gradient reaching each token's log-prob and value: none in the span, some on every trained token.
    trained = holed["response_mask"].bool()
    for grad in [*grads, *(t.grad for t in spied)]:
        assert (grad[:, SPAN] == 0).all()
        assert (grad[trained] != 0).all()
    # The same rows trained whole update differently: the span's tokens would have trained.
    trained_whole = updated(with_training_fields(whole, garbage=False))
    assert any(not torch.equal(trained_whole[k], clean[k]) for k in clean)


@pytest.mark.parametrize("estimator", sorted(ADV_ESTIMATORS))
def test_every_estimator_leaves_the_span_without_advantage(batches, estimator):
    _, holed = batches
    g = torch.Generator().manual_seed(2)
    rewards = torch.zeros(4, R)
    rewards[torch.arange(4), torch.tensor(LENGTHS) - 1] = torch.randn(4, generator=g)
    advantages, returns = compute_advantage(estimator, rewards, holed["response_mask"],
                                            index=torch.tensor([0, 0, 1, 1]), values=torch.randn(4, R, generator=g),
                                            gamma=1.0, lam=1.0)
    assert (advantages[:, SPAN] == 0).all() and (returns[:, SPAN] == 0).all()
    assert advantages[holed["response_mask"].bool()].abs().sum() > 0


def test_a_response_cut_inside_a_tool_turn_keeps_its_score(tokenizer):
    # Two answers to one prompt, R = 6. Row 0: sampled 0-1, tool output 2-5 cut by the budget (no answer,
    # score -1). Row 1: sampled 0, tool output 1-3, sampled 4 (a wrong answer, score 0), padding at 5.
    attention = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])
    trained = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 1, 0]])
    responses = torch.where(attention.bool(), torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]]),
                            tokenizer.pad_token_id)

    def by_row(data_source, solution_str, ground_truth, extra_info):
        return {"score": extra_info["score"]}

    rows = {"data_source": NonTensorStack.from_list(["kk_logic"] * 2),
            "ground_truth": NonTensorStack.from_list([{}] * 2),
            "extra_info": NonTensorStack.from_list([{"score": -1.0}, {"score": 0.0}])}
    batch = TensorDict({"responses": responses, "response_attention_mask": attention, "response_mask": trained,
                        **rows}, batch_size=[2])
    scores, _, _, _ = RewardManager(tokenizer, custom_fn=by_row)(batch)
    # On the last trained tokens (1 and 4), not on row 0's last attended one (5), which the loss mask drops.
    assert scores.tolist() == [[0, -1.0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]]
    # GRPO over the pair: scores -1 and 0, mean -0.5, unbiased std 1/sqrt(2): advantages -/+ 0.5*sqrt(2) on
    # the trained tokens. With the score on token 5 both rows scored 0 and neither learned anything.
    adv, _ = compute_advantage("grpo", scores, trained, index=torch.tensor([0, 0]))
    a = 0.5 * 2 ** 0.5
    assert adv == pytest.approx(torch.tensor([[-a, -a, 0, 0, 0, 0], [a, 0, 0, 0, a, 0]]), abs=1e-5)
