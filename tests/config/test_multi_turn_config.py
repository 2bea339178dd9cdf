"""actor_rollout_ref.rollout.multi_turn: verl's keys and defaults, a verl multi-turn script's keys accepted
or refused by name, one-line refusals before anything starts, and the dry run's turn budget."""

from __future__ import annotations

import logging

import pytest

from logicrl.config import ConfigError, check_overrides, compose, validate
from logicrl.config.phases import ARR
from tests.conftest import assert_refused, check_main

MT = f"{ARR}.rollout.multi_turn"

# verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml, verbatim.
TOOL_YAML = """tools:
  - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
    config:
      type: native
    tool_schema:
      type: "function"
      function:
        name: "calc_gsm8k_reward"
        description: "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, 0.0 if parsed \
answer is incorrect or not correctly parsed)"
        parameters:
          type: "object"
          properties:
            answer:
              type: "string"
              description: "The model's answer to the GSM8K math problem, must be a digits"
          required: ["answer"]
"""


@pytest.fixture
def tool_yaml(tmp_path):
    path = tmp_path / "tool_config.yaml"
    path.write_text(TOOL_YAML)
    return str(path)


def verl_multi_turn_script(tool_config: str) -> list[str]:
    """The multi-turn keys of verl's examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh and its
    gsm8k_multiturn_grpo.yaml (rollout.name vllm: logicrl runs no sglang), paths changed."""
    return [
        "data.return_raw_chat=True",
        f"{ARR}.rollout.mode=async",
        f"{MT}.enable=True", f"{MT}.max_assistant_turns=5", f"{MT}.format=hermes",
        f"{MT}.tool_config_path={tool_config}",
        f"{MT}.max_user_turns=null", f"{MT}.tokenization_sanity_check_mode=strict",
        f"{MT}.use_inference_chat_template=False",
        f"{ARR}.rollout.agent.num_workers=8",
    ]


def test_verls_defaults():
    mt = compose([])[ARR].rollout.multi_turn
    assert (mt.enable, mt.max_assistant_turns, mt.max_parallel_calls, mt.max_tool_response_length,
            mt.tool_response_truncate_side, mt.tool_config_path, mt.function_tool_path, mt.format) == \
        (False, None, 1, 256, "middle", None, None, "hermes")


def test_a_verl_multi_turn_script_validates_and_each_verl_only_key_says_what_it_became(data_files, tool_yaml,
                                                                                         caplog):
    overrides = data_files + verl_multi_turn_script(tool_yaml)
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        cfg, _, _ = validate(compose(check_overrides(overrides)))
    mt = cfg[ARR].rollout.multi_turn
    assert mt.enable and mt.max_assistant_turns == 5 and mt.tool_config_path == tool_yaml
    warned = " ".join(r.getMessage() for r in caplog.records)
    for key in ("max_user_turns=None", "tokenization_sanity_check_mode=strict", "use_inference_chat_template=False",
                "agent.num_workers=8"):
        assert key in warned, key
    dry = check_main(*overrides, "trainer.dry_run=true")  # main_ppo.py's dry run of the script, in-process
    assert dry.code == 0, dry.line
    assert "multi-turn with tools (" in dry.out and "at most 5 assistant turns" in dry.out


def test_verls_tool_agent_loop_turns_the_tool_loop_on(data_files, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        cfg, _, _ = validate(compose(check_overrides([*data_files,
                                                      f"{ARR}.rollout.agent.default_agent_loop=tool_agent"])))
    assert cfg[ARR].rollout.multi_turn.enable
    assert "using actor_rollout_ref.rollout.multi_turn.enable=True" in caplog.text


@pytest.mark.parametrize("override, needle", [
    (f"{MT}.max_user_turns=3", "user turns"),
    (f"{MT}.interaction_config_path=/x.yaml", "interactions"),
    (f"{ARR}.rollout.agent.default_agent_loop=react_agent", "single_turn_agent and tool_agent"),
    (f"{ARR}.rollout.agent.agent_loop_config_path=/x.yaml", "custom agent loops"),
])
def test_what_logicrl_cannot_do_is_refused_by_name(data_files, override, needle):
    with pytest.raises(ConfigError) as err:
        validate(compose(check_overrides([*data_files, f"{MT}.enable=True", override])))
    message = str(err.value)
    assert "\n" not in message and message.startswith(override.split("=")[0]) and needle in message, message


def test_a_bad_tool_config_is_one_line_before_anything_starts(data_files, tmp_path):
    bad = tmp_path / "tools.yaml"
    bad.write_text("tools:\n  - class_name: nowhere.Tool\n")
    checked = check_main(*data_files, f"{MT}.enable=true", f"{MT}.tool_config_path={bad}", "trainer.dry_run=true")
    assert_refused(checked, "tool_config_path", "nowhere.Tool")
    checked = check_main(*data_files, f"{MT}.enable=true", f"{MT}.tool_config_path={tmp_path / 'missing.yaml'}",
                         "trainer.dry_run=true")
    assert_refused(checked, "missing.yaml")


def test_tensor_parallel_rollouts_are_refused_with_tools(data_files):
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=1"):
        validate(compose([*data_files, f"{MT}.enable=True", f"{ARR}.rollout.tensor_model_parallel_size=2",
                          "trainer.n_gpus=2"]))


def test_an_unknown_format_or_side_is_refused(data_files):
    for override in (f"{MT}.format=json", f"{MT}.tool_response_truncate_side=top"):
        with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
            validate(compose([*data_files, override]))


def test_tool_paths_without_enable_say_they_do_nothing(data_files, tool_yaml, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        validate(compose([*data_files, f"{MT}.tool_config_path={tool_yaml}"]))
    assert "takes effect only with actor_rollout_ref.rollout.multi_turn.enable=true" in caplog.text


def test_an_assistant_opening_is_plain_text_and_needs_enable(data_files, caplog):
    assert compose([])[ARR].rollout.multi_turn.assistant_opening == ""
    validate(compose([*data_files, f"{MT}.enable=true", f"{MT}.assistant_opening='<answer> It is'"]))
    with pytest.raises(ConfigError) as err:
        validate(compose([*data_files, f"{MT}.enable=true", f"{MT}.assistant_opening='<|im_end|>'"]))
    assert str(err.value).startswith(f"{MT}.assistant_opening=") and "<|im_end|>" in str(err.value)
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        validate(compose([*data_files, f"{MT}.assistant_opening=Answer:"]))
    assert "assistant_opening='Answer:' takes effect only with" in caplog.text


def test_the_dry_run_prints_the_turn_budget(data_files):
    checked = check_main(*data_files, f"{MT}.enable=true", f"{MT}.max_assistant_turns=3", "data.max_response_length=96",
                         "trainer.dry_run=true")
    assert checked.code == 0, checked.line
    line = next(x for x in checked.out.splitlines() if x.startswith("turns"))
    assert "at most 3 assistant turns" in line and "data.max_response_length=96" in line
    assert "built-in calculator and code_interpreter" in line
    off = check_main(*data_files, "trainer.dry_run=true")
    assert not any(x.startswith("turns") for x in off.out.splitlines())


def test_prompts_list_the_tools_where_the_chat_template_does(tmp_path):
    """As verl renders its prompts: the tool schemas go to the chat template (a Qwen-style one lists them)."""
    import copy

    from logicrl.config.multi_turn import prompt_tools
    from logicrl.data.dataset import load_prompts
    from logicrl.models.loading import load_tokenizer
    from tests.conftest import row, write_rows

    tok = copy.deepcopy(load_tokenizer("embedded:tiny", quiet=True))
    tok.chat_template = ("{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for t in tools %}"
                         "{{- t.function.name + '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}"
                         "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
                         "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    files = str(write_rows(tmp_path / "rows.jsonl", [row(0)]))
    on = compose([f"data.train_files={files}", f"{MT}.enable=true"])
    off = compose([f"data.train_files={files}"])
    assert prompt_tools(off) is None
    schemas = prompt_tools(on)
    assert sorted(s["function"]["name"] for s in schemas) == ["calculator", "code_interpreter"]
    listed = load_prompts(files, tok, max_prompt_length=512, tools=schemas)[0].prompt_text
    plain = load_prompts(files, tok, max_prompt_length=512)[0].prompt_text
    assert listed == "<|im_start|>system\ncalculator\ncode_interpreter\n<|im_end|>\n" + plain
