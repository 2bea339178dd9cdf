"""Loading a user's reward from reward.custom.path / reward.custom.name."""

import textwrap

import pytest

from logicrl.reward.custom import CustomRewardError, load_custom_reward, wrap_custom_reward

GOOD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if solution_str == ground_truth else 0.0

def with_components(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 2, "length": len(solution_str)}

def helper(x):
    return x

THRESHOLD = 3
"""


def write(tmp_path, source, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_loads_the_named_function_and_wraps_a_float(tmp_path):
    path = write(tmp_path, GOOD)
    fn = load_custom_reward(str(path), "compute_score")
    assert fn(data_source="d", solution_str="a", ground_truth="a") == 1.0
    wrapped = wrap_custom_reward(fn, "compute_score")
    assert wrapped("d", "a", "a") == {"score": 1.0}
    assert wrapped("d", "a", "b", extra_info={"index": 3}) == {"score": 0.0}


def test_dict_results_keep_their_components(tmp_path):
    wrapped = wrap_custom_reward(load_custom_reward(write(tmp_path, GOOD), "with_components"))
    assert wrapped("d", "abc", None) == {"score": 2.0, "length": 3}


def test_two_files_with_the_same_function_name_do_not_shadow_each_other(tmp_path):
    one = load_custom_reward(write(tmp_path, "def f(**kw):\n    return 1.0\n", "a.py"), "f")
    two = load_custom_reward(write(tmp_path, "def f(**kw):\n    return 2.0\n", "b.py"), "f")
    assert (one(), two()) == (1.0, 2.0)


def assert_one_line_error(path, name, key, *fragments):
    with pytest.raises(CustomRewardError) as info:
        load_custom_reward(path, name)
    message = str(info.value)
    assert "\n" not in message and key in message
    for fragment in fragments:
        assert fragment in message
    assert isinstance(info.value, ValueError)  # config validation catches ValueError


def test_missing_file(tmp_path):
    assert_one_line_error(str(tmp_path / "nope.py"), "compute_score", "reward.custom.path", "nope.py", "missing")


def test_directory_instead_of_file(tmp_path):
    assert_one_line_error(str(tmp_path), "compute_score", "reward.custom.path", "a directory")


def test_empty_path():
    assert_one_line_error("", "compute_score", "reward.custom.path", "empty")


def test_file_that_fails_to_import(tmp_path):
    path = write(tmp_path, "import no_such_module_for_logicrl_tests\n")
    assert_one_line_error(str(path), "compute_score", "reward.custom.path", "ModuleNotFoundError", str(path))


def test_file_with_a_syntax_error(tmp_path):
    path = write(tmp_path, "def compute_score(:\n")
    assert_one_line_error(str(path), "compute_score", "reward.custom.path", "SyntaxError")


def test_file_that_exits_at_import(tmp_path):
    # A stray sys.exit() must not end config validation with the user's exit code.
    path = write(tmp_path, "import sys\nsys.exit(3)\n")
    assert_one_line_error(str(path), "compute_score", "reward.custom.path", "SystemExit")


def test_missing_function_lists_the_ones_defined(tmp_path):
    path = write(tmp_path, GOOD)
    assert_one_line_error(str(path), "reward_fn", "reward.custom.name", "'reward_fn'", "compute_score", "helper")


def test_non_callable_attribute(tmp_path):
    path = write(tmp_path, GOOD)
    assert_one_line_error(str(path), "THRESHOLD", "reward.custom.name", "int, not a function")


def test_function_that_cannot_take_verls_keywords(tmp_path):
    path = write(tmp_path, GOOD)
    assert_one_line_error(str(path), "helper", "reward.custom.name", "signature")


def test_name_that_is_not_an_identifier(tmp_path):
    assert_one_line_error(str(write(tmp_path, GOOD)), "my-reward", "reward.custom.name", "identifier")


def test_non_python_file(tmp_path):
    path = write(tmp_path, GOOD, "reward.txt")
    assert_one_line_error(str(path), "compute_score", "reward.custom.path", "not a Python source file")


def test_wrapped_bad_result_raises_naming_the_function(tmp_path):
    fn = load_custom_reward(write(tmp_path, "def f(**kw):\n    return 'high'\n"), "f")
    with pytest.raises(TypeError, match="custom reward f"):
        wrap_custom_reward(fn, "f")("d", "x", None)
