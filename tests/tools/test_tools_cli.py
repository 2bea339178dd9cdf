"""`python -m logicrl.tools`, in-process: what the model would see on stdout, a status line on stderr,
exit 0 / 1 (the tool answered an error) / 2 (bad config)."""

import json

from logicrl.tools.__main__ import main


def test_call_a_builtin(capsys):
    assert main(["call", "calculator", '{"expr": "6*7"}']) == 0
    out, err = capsys.readouterr()
    assert out == "42\n" and err.startswith("[calculator: ok, ")


def test_tool_errors_exit_1(capsys):
    assert main(["call", "calculator", '{"expr": "6*"}']) == 1
    assert capsys.readouterr().out.startswith("Error (bad_arguments): not an arithmetic expression")
    assert main(["call", "calculator", "{not json"]) == 1
    assert capsys.readouterr().out.startswith("Error (bad_arguments): the arguments of calculator must be")
    assert main(["call", "nope", "{}"]) == 1
    assert "no tool named 'nope'" in capsys.readouterr().out


def test_function_file_and_listing(tmp_path, capsys):
    path = tmp_path / "fns.py"
    path.write_text('def shout(text: str) -> str:\n    """Upper-case it.\n\n    Args:\n        text: The text.\n'
                    '    """\n    return text.upper()\n')
    assert main(["call", str(path), "shout", '{"text": "hi"}']) == 0
    assert capsys.readouterr().out == "HI\n"
    assert main(["list", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["function"]["name"] == "shout"


def test_bad_config_exits_2(tmp_path, capsys):
    assert main(["call", str(tmp_path / "absent.yaml"), "calculator", "{}"]) == 2
    assert capsys.readouterr().err.startswith(f"error: tool_config_path={tmp_path / 'absent.yaml'}: no such file")


def test_row_kwargs(tmp_path, capsys):
    path = tmp_path / "gsm8k.yaml"
    path.write_text("tools:\n  - class_name: verl.tools.gsm8k_tool.Gsm8kTool\n")
    kwargs = '{"create_kwargs": {"ground_truth": "72"}}'
    assert main(["call", str(path), "calc_gsm8k_reward", '{"answer": "72"}', "--kwargs", kwargs]) == 0
    assert capsys.readouterr().out == "Current parsed answer='72' reward=1.0\n"
    assert main(["call", str(path), "calc_gsm8k_reward", '{"answer": "72"}']) == 1
    assert capsys.readouterr().out.startswith("Error (missing_kwargs): calc_gsm8k_reward needs the row's")
    assert main(["call", str(path), "calc_gsm8k_reward", "{}", "--kwargs", "[1]"]) == 2
