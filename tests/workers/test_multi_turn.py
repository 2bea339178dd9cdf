"""The tool loop's mechanics with a scripted engine (no learning): token identity across turns, the
template's separator kept, masks and log-probs per token, the budget cutting a trajectory with its masks,
the turn and call limits, per-row tool kwargs. Both the tiny model's ChatML template and a Qwen2.5-style
one (tool answers as a user turn of <tool_response> blocks) are checked."""

from __future__ import annotations

import copy

import pytest
import torch

from logicrl.data.tool_turns import ChatTemplateError, ToolTurns, truncate_text
from logicrl.models.loading import load_tokenizer
from logicrl.tools import ToolResult, parse_hermes
from logicrl.workers.rollout import RolloutOutput, SamplingParams
from logicrl.workers.rollout.multi_turn import MultiTurnEngine, TurnLimits, left_pad, row_tools_kwargs

# Qwen2.5's handling of tool messages (its template, without the tools-in-system block).
QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CALL = '<tool_call>\n{{"name": "calculator", "arguments": {{"expr": "{}"}}}}\n</tool_call>'
ANSWERS = {"12*7": "84", "3+4": "7", "9*9": "81"}

# Per row: the question, then the text of each assistant turn the scripted engine writes.
SCRIPTS = [
    ("What is 12*7?", ["Let me compute. " + CALL.format("12*7"), "<answer>84</answer>"]),
    ("Say three.", ["<answer>3</answer>"]),
    ("What is 3+4 and 9*9?", [CALL.format("3+4") + CALL.format("9*9"), "<answer>7 81</answer>"]),
]


@pytest.fixture(scope="module", params=["chatml", "qwen"])
def tokenizer(request):
    tok = copy.deepcopy(load_tokenizer("embedded:tiny", quiet=True))
    if request.param == "qwen":
        tok.chat_template = QWEN_TEMPLATE
    return tok


class ScriptedEngine:
    """Writes each prompt's scripted turns, one per call on that prompt, as canonical token ids followed by
    the end-of-turn token; log-prob -(column + 1) / 100. Records every context it is given."""

    micro_batch_size = 8
    weights_valid = True

    def __init__(self, tokenizer, prompts: list[list[int]], turns: list[list[str]]):
        self.end = ToolTurns(tokenizer).end_of_turn_id
        self.script = {tuple(p): [tokenizer.encode(t, add_special_tokens=False) + [self.end] for t in ts]
                       for p, ts in zip(prompts, turns)}
        self.calls = {tuple(p): 0 for p in prompts}
        self.seen: list[list[int]] = []
        self.pad = tokenizer.pad_token_id

    def generate(self, input_ids, attention_mask, params: SamplingParams, micro_batch_size=None) -> RolloutOutput:
        width = params.max_tokens
        out, seen = [], [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask)]
        for context in seen:
            self.seen.append(context)
            prompt = next(p for p in self.script if tuple(context[:len(p)]) == p)
            out.append(self.script[prompt][self.calls[prompt]][:width])
            self.calls[prompt] += 1
        responses = torch.full((len(out), width), self.pad)
        mask = torch.zeros((len(out), width), dtype=torch.long)
        for i, ids in enumerate(out):
            responses[i, :len(ids)] = torch.tensor(ids)
            mask[i, :len(ids)] = 1
        log_probs = torch.where(mask.bool(), -(torch.arange(width, dtype=torch.float32) + 1) / 100, 0.0)
        return RolloutOutput(responses, mask, mask.clone(), log_probs)


class FakeRunner:
    def __init__(self):
        self.seen = []

    def run(self, calls, tools_kwargs=None):
        self.seen.append(([c.name for c in calls], tools_kwargs))
        return [ToolResult(ANSWERS[c.arguments["expr"]], True, None, 0.25) for c in calls]


def prompt_ids(tokenizer, question: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                         add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


PARALLEL = TurnLimits(max_parallel_calls=4)


def rollout(tokenizer, budget=400, limits=PARALLEL, scripts=SCRIPTS, kwargs=None, opening=""):
    prompts = [prompt_ids(tokenizer, q) for q, _ in scripts]
    engine = ScriptedEngine(tokenizer, prompts, [t for _, t in scripts])
    runner = FakeRunner()
    loop = MultiTurnEngine(engine, tokenizer, runner, parse_hermes, limits, opening)
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    out = loop.generate(ids, mask, SamplingParams(max_tokens=budget, seed=1), tools_kwargs=kwargs)
    return prompts, out, engine, runner


def final_messages(question: str, turns: list[str], stop: int | None = None) -> list[dict]:
    """The conversation the trajectory should be: each assistant turn's text, then its calls' answers."""
    messages = [{"role": "user", "content": question}]
    for text in turns[:stop]:
        messages.append({"role": "assistant", "content": text})
        messages += [{"role": "tool", "name": c.name, "content": ANSWERS[c.arguments["expr"]]}
                     for c in parse_hermes(text)]
    return messages


def test_the_ids_are_the_chat_templates_rendering_of_the_final_conversation(tokenizer):
    prompts, out, _, _ = rollout(tokenizer)
    sep = tokenizer.encode(ToolTurns(tokenizer).separator, add_special_tokens=False)
    for i, (question, turns) in enumerate(SCRIPTS):
        n = int(out.response_lengths[i])
        assert n < out.responses.shape[1]  # each trajectory ended by itself, not at the budget
        rendered = tokenizer.apply_chat_template(final_messages(question, turns), tokenize=False)
        # The rendering ends with the last turn's end-of-turn token and the separator after it; the model
        # stopped on that token, so the trajectory ends just before the separator.
        assert prompts[i] + out.responses[i, :n].tolist() + sep == tokenizer.encode(rendered, add_special_tokens=False)


def test_an_assistant_opening_starts_each_turn_after_a_tool_answer_untrained(tokenizer):
    opening = "<answer> It is"
    prompts, out, engine, _ = rollout(tokenizer, opening=opening)
    sep = tokenizer.encode(ToolTurns(tokenizer).separator, add_special_tokens=False)
    for i, (question, turns) in enumerate(SCRIPTS):
        n = int(out.response_lengths[i])
        # The final conversation: every assistant message after the first starts with the opening.
        rendered = tokenizer.apply_chat_template(final_messages(question, turns[:1] + [opening + t for t in turns[1:]]),
                                                 tokenize=False)
        assert prompts[i] + out.responses[i, :n].tolist() + sep == tokenizer.encode(rendered, add_special_tokens=False)
        # Only what the engine sampled trains; the opening is the tool turn's, as the template's markup is.
        sampled = sum(len(t) for t in engine.script[tuple(prompts[i])])
        assert int(out.response_mask[i].sum()) == sampled
    row1 = int(out.response_lengths[1])  # called nothing: no tool turn, no opening
    assert opening not in tokenizer.decode(out.responses[1, :row1].tolist())


def test_the_separator_after_each_assistant_turn_is_kept(tokenizer):
    _, out, engine, _ = rollout(tokenizer)
    turns = ToolTurns(tokenizer)
    sep = tokenizer.encode(turns.separator, add_special_tokens=False)
    row = out.responses[0].tolist()
    first_end = row.index(turns.end_of_turn_id)
    assert sep and row[first_end + 1:first_end + 1 + len(sep)] == sep
    assert out.response_mask[0, first_end + 1] == 0  # the separator is the template's, not the model's


def test_each_turn_continues_from_the_exact_ids_so_far(tokenizer):
    prompts, out, engine, _ = rollout(tokenizer)
    # Row 0's second call saw its prompt, its first turn and the tool turn: the response's ids up to there.
    second = [c for c in engine.seen if c[:len(prompts[0])] == prompts[0]][1]
    assert second == prompts[0] + out.responses[0, :len(second) - len(prompts[0])].tolist()


def test_masks_and_log_probs_token_by_token(tokenizer):
    _, out, engine, _ = rollout(tokenizer)
    end = engine.end
    row, trained = out.responses[0].tolist(), out.response_mask[0].tolist()
    n = int(out.response_lengths[0])
    first, second = engine.script[next(iter(engine.script))]
    tool = n - len(first) - len(second)
    assert trained[:n] == [1] * len(first) + [0] * tool + [1] * len(second)
    assert out.response_attention_mask[0, :n].eq(1).all() and out.response_attention_mask[0, n:].eq(0).all()
    # Every assistant turn's end-of-turn token trains: the model learns to stop (and to hand over to a tool).
    assert [trained[i] for i in range(n) if row[i] == end and trained[i]] == [1, 1]
    assert out.log_probs[0, len(first):len(first) + tool].eq(0).all()
    assert out.log_probs[0, :len(first)].lt(0).all() and out.log_probs[0, len(first) + tool:n].lt(0).all()
    # Row 1 called nothing: one turn, all of it trained.
    n1 = int(out.response_lengths[1])
    assert out.response_mask[1, :n1].eq(1).all() and out.extras["num_turns"][1] == 1


def test_turn_and_tool_counts(tokenizer):
    _, out, _, runner = rollout(tokenizer)
    assert out.extras["num_turns"].tolist() == [2, 1, 2]
    assert out.extras["tool_calls"].tolist() == [1, 0, 2]
    assert out.extras["tool_failures"].tolist() == [0, 0, 0]
    assert out.extras["tool_latency_s"].tolist() == [0.25, 0, 0.5]
    assert sorted(names for names, _ in runner.seen) == [["calculator"], ["calculator", "calculator"]]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_budget_inside_the_tool_turn_cuts_ids_and_masks_together(tokenizer, where):
    _, whole, engine, _ = rollout(tokenizer)
    first = len(engine.script[next(iter(engine.script))][0])
    tool = int((whole.response_attention_mask[0] - whole.response_mask[0]).sum())
    # Inside row 0's tool turn, after its first, middle or last-but-one token (row 2 is cut somewhere too).
    budget = first + {"first": 1, "middle": tool // 2, "last": tool - 1}[where]
    _, out, _, _ = rollout(tokenizer, budget=budget)
    assert out.responses.shape == out.response_mask.shape == out.log_probs.shape == (3, budget)
    for i in range(3):
        n = int(out.response_lengths[i])
        assert n <= budget
        for name in ("responses", "response_mask", "response_attention_mask", "log_probs"):
            assert torch.equal(getattr(out, name)[i, :n], getattr(whole, name)[i, :n]), name
    assert int(out.response_lengths[0]) == budget and out.extras["num_turns"][0] == 1  # no turn after the cut


def test_a_budget_inside_an_assistant_turn_runs_no_tool(tokenizer):
    _, out, _, runner = rollout(tokenizer, budget=6)
    assert runner.seen == [] and out.extras["tool_calls"].sum() == 0
    assert out.response_mask.eq(out.response_attention_mask).all()


def test_max_assistant_turns_stops_before_running_tools(tokenizer):
    _, out, _, runner = rollout(tokenizer, limits=TurnLimits(max_assistant_turns=1))
    assert runner.seen == [] and out.extras["num_turns"].tolist() == [1, 1, 1]


def test_calls_past_max_parallel_calls_are_answered_with_an_error(tokenizer):
    _, out, _, runner = rollout(tokenizer, limits=TurnLimits(max_parallel_calls=1))
    assert out.extras["tool_calls"].tolist() == [1, 0, 2] and out.extras["tool_failures"].tolist() == [0, 0, 1]
    assert [names for names, _ in runner.seen].count(["calculator"]) == 2  # row 2 ran only its first call
    n = int(out.response_lengths[2])
    assert "too_many_calls" in tokenizer.decode(out.responses[2, :n].tolist())


def test_each_row_gets_its_own_tools_kwargs(tokenizer):
    kwargs = row_tools_kwargs([{"tools_kwargs": {"calculator": {"create_kwargs": {"row": 0}}}}, None,
                               {"other": 1}])
    assert kwargs == [{"calculator": {"create_kwargs": {"row": 0}}}, {}, {}]
    _, _, _, runner = rollout(tokenizer, kwargs=kwargs)
    assert {len(names): kw for names, kw in runner.seen} == {1: kwargs[0], 2: {}}


def test_long_tool_answers_are_cut_as_verl_cuts_them():
    text = "abcdefghij"
    assert truncate_text(text, 4, "left") == "abcd...(truncated)"
    assert truncate_text(text, 4, "right") == "(truncated)...ghij"
    assert truncate_text(text, 4, "middle") == "ab\n...(truncated)...\nij"
    assert truncate_text(text, 10, "middle") == text


def test_a_template_that_rewrites_earlier_turns_is_refused():
    tok = copy.deepcopy(load_tokenizer("embedded:tiny", quiet=True))
    # Drops every assistant message once a tool has answered (as templates that strip reasoning do).
    tok.chat_template = ("{%- set tools = messages | selectattr('role', 'equalto', 'tool') | list %}"
                         "{%- for m in messages %}{%- if not (tools and m.role == 'assistant') %}"
                         "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
                         "{%- endfor %}")
    with pytest.raises(ChatTemplateError, match="append-only"):
        ToolTurns(tok)


def test_a_call_the_prompt_opened_the_assistant_turn_with_is_run(tokenizer):
    # The prompt continues an assistant message that already holds the call (as the K&K templates open
    # <think>); the model only closes the turn, and the call is run.
    messages = [{"role": "user", "content": "What is 12*7?"}, {"role": "assistant", "content": CALL.format("12*7")}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    engine = ScriptedEngine(tokenizer, [prompt], [["", "<answer>84</answer>"]])
    runner = FakeRunner()
    loop = MultiTurnEngine(engine, tokenizer, runner, parse_hermes, PARALLEL)
    ids, mask = left_pad([prompt], tokenizer.pad_token_id)
    out = loop.generate(ids, mask, SamplingParams(max_tokens=200, seed=1))
    assert out.extras["tool_calls"].tolist() == [1] and out.extras["num_turns"].tolist() == [2]
    n = int(out.response_lengths[0])
    tool_turn = ToolTurns(tokenizer).text([{"role": "tool", "name": "calculator", "content": "84"}])
    assert tokenizer.decode(out.responses[0, :n].tolist()) == f"<|im_end|>{tool_turn}<answer>84</answer><|im_end|>"


class ClosesFirstTurn:
    """The HF engine, except that each row's first turn is just the end-of-turn token (so every row's call,
    opened by the prompt, runs): the turns after the tool's answer are the model's own samples."""

    def __init__(self, engine, end: int):
        self.engine, self.end, self.first = engine, end, True
        self.micro_batch_size, self.weights_valid = engine.micro_batch_size, True

    def generate(self, input_ids, attention_mask, params, micro_batch_size=None):
        if not self.first:
            return self.engine.generate(input_ids, attention_mask, params, micro_batch_size)
        self.first = False
        rows, width = input_ids.shape[0], params.max_tokens
        responses = torch.zeros((rows, width), dtype=torch.long)
        responses[:, 0] = self.end
        mask = torch.zeros((rows, width), dtype=torch.long)
        mask[:, 0] = 1
        return RolloutOutput(responses, mask, mask.clone(), torch.where(mask.bool(), -1.0, 0.0))


def test_the_trainers_log_probs_after_a_tool_turn_are_the_engines():
    """The HF engine samples the turn after the tool's answer from the ids so far; the trainer's forward over the
    whole sequence (both masks as the worker builds them) must give the same log-probs for those tokens."""
    from logicrl.models.loading import load_causal_lm
    from logicrl.workers.rollout.hf import HFRolloutEngine

    tok = load_tokenizer("embedded:tiny", quiet=True)
    model = load_causal_lm("embedded:tiny", torch.float32).eval()
    turns = ToolTurns(tok)
    hf = HFRolloutEngine(model, pad_id=tok.pad_token_id, eos_ids=[turns.end_of_turn_id], micro_batch_size=4)
    questions = ["What is 12*7?", "What is 3+4?", "What is 9*9?"]
    prompts = []
    for q, expr in zip(questions, ["12*7", "3+4", "9*9"]):
        messages = [{"role": "user", "content": q}, {"role": "assistant", "content": CALL.format(expr)}]
        prompts.append(tok.encode(tok.apply_chat_template(messages, tokenize=False, continue_final_message=True),
                                  add_special_tokens=False))
    loop = MultiTurnEngine(ClosesFirstTurn(hf, turns.end_of_turn_id), tok, FakeRunner(), parse_hermes,
                           TurnLimits(max_assistant_turns=2))
    ids, mask = left_pad(prompts, tok.pad_token_id)
    out = loop.generate(ids, mask, SamplingParams(max_tokens=32, seed=3))
    assert out.extras["tool_calls"].tolist() == [1, 1, 1]
    full = torch.cat([ids, out.responses], 1)
    attention = torch.cat([mask, out.response_attention_mask], 1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=attention, position_ids=positions).logits.float()
    p = ids.shape[1]
    trainer = torch.log_softmax(logits[:, p - 1:-1], -1).gather(-1, out.responses[..., None]).squeeze(-1)
    second = out.response_mask.bool()
    second[:, 0] = False  # the scripted first turn
    assert second.sum() > 0 and (out.response_mask - out.response_attention_mask).ne(0).any()
    torch.testing.assert_close(trainer[second], out.log_probs[second], atol=1e-4, rtol=0)
