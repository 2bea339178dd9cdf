"""ToolRunner: results in the calls' order, at most max_parallel_calls at once, each call timed from
its start (not its wait for a slot), and every failure a ToolResult; a tool that hangs for ever costs
a bounded number of threads."""

import threading
import time

from logicrl.tools import ToolCall, ToolResult, ToolRunner
from logicrl.tools.base import function_schema


class Probe:
    """A tool that sleeps, blocks, raises or echoes, and records how many calls ran at once."""

    def __init__(self, name="probe"):
        self.name = name
        self.schema = function_schema(name, "test tool", {"mode": {"type": "string"}, "s": {"type": "number"}},
                                      ["mode"])
        self.lock, self.running, self.peak = threading.Lock(), 0, 0
        self.release = threading.Event()

    def call(self, arguments, **kwargs):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            mode = arguments["mode"]
            if mode == "sleep":
                time.sleep(arguments["s"])
                return ToolResult.success(f"slept {arguments['s']}")
            if mode == "block":
                self.release.wait()
                return ToolResult.success("released")
            if mode == "raise":
                raise KeyError("no such row")
            if mode == "plain":
                return 42  # not a ToolResult: the runner turns it into one
            return ToolResult.success(repr(sorted(kwargs.items())))
        finally:
            with self.lock:
                self.running -= 1


def test_parallel_up_to_the_limit_in_order():
    probe = Probe()
    runner = ToolRunner({"probe": probe}, max_parallel_calls=2, timeout_s=5)
    start = time.monotonic()
    results = runner.run([ToolCall("probe", {"mode": "sleep", "s": s}) for s in (0.2, 0.21, 0.22, 0.23)])
    elapsed = time.monotonic() - start
    assert [r.text for r in results] == ["slept 0.2", "slept 0.21", "slept 0.22", "slept 0.23"]
    assert probe.peak == 2 and elapsed >= 0.4  # two waves of two, never three at once
    assert all(r.ok and 0.19 < r.latency_s < 1.0 for r in results)  # its run, not its wait


def test_waiting_for_a_slot_is_not_the_calls_time():
    runner = ToolRunner({"probe": Probe()}, max_parallel_calls=1, timeout_s=0.3)
    results = runner.run([ToolCall("probe", {"mode": "sleep", "s": 0.2})] * 3)  # 0.6 s in all, 0.2 s each
    assert [r.ok for r in results] == [True, True, True]


def test_every_failure_is_a_result():
    runner = ToolRunner({"probe": Probe()}, max_parallel_calls=4, timeout_s=5)
    calls = [ToolCall("", {}, raw='{"name": "probe", '), ToolCall("nope", {"mode": "x"}),
             ToolCall("probe", {}), ToolCall("probe", {"mode": 3}), ToolCall("probe", {"mode": "x", "extra": 1}),
             ToolCall("probe", {}, raw='{"name": "probe", "arguments": [1]}'),
             ToolCall("probe", {"mode": "raise"}), ToolCall("probe", {"mode": "plain"})]
    results = runner.run(calls)
    assert [r.error for r in results] == ["bad_json", "unknown_tool", "bad_arguments", "bad_arguments",
                                          "bad_arguments", "bad_arguments", "exception", None]
    assert results[1].text == "Error (unknown_tool): no tool named 'nope'; tools: probe"
    assert "missing required argument(s) mode" in results[2].text
    assert "`mode` must be string, got int 3" in results[3].text
    assert "unknown argument(s) extra" in results[4].text
    assert results[6].text == "Error (exception): KeyError: 'no such row'"
    assert (results[7].text, results[7].ok) == ("42", True)


def test_timeout_answers_at_once_and_hung_threads_are_bounded():
    probe = Probe()
    runner = ToolRunner({"probe": probe}, max_parallel_calls=1, timeout_s=0.2, max_hung=1)
    try:
        start = time.monotonic()
        hung, after = runner.run([ToolCall("probe", {"mode": "block"}), ToolCall("probe", {"mode": "echo"})])
        assert (hung.ok, hung.error) == (False, "timeout") and 0.19 < hung.latency_s < 1.5
        assert after.ok  # the hung call gave its slot back
        assert time.monotonic() - start < 3.0  # not blocked on the hung thread
        refused = runner.run([ToolCall("probe", {"mode": "echo"})])[0]
        assert refused.error == "limit" and "still running past their timeout" in refused.text
    finally:
        probe.release.set()
    deadline = time.monotonic() + 2
    while runner.run([ToolCall("probe", {"mode": "echo"})])[0].error == "limit" and time.monotonic() < deadline:
        time.sleep(0.01)  # the hung thread ends and is no longer counted
    assert runner.run([ToolCall("probe", {"mode": "echo"})])[0].ok


def test_row_tools_kwargs_reach_the_tool_merged():
    runner = ToolRunner({"probe": Probe(), "other": Probe("other")}, max_parallel_calls=2, timeout_s=5)
    kwargs = {"probe": {"create_kwargs": {"ground_truth": "7", "k": 1}, "execute_kwargs": {"k": 2},
                        "calc_reward_kwargs": {"ignored": True}}}
    mine, other = runner.run([ToolCall("probe", {"mode": "echo"}), ToolCall("other", {"mode": "echo"})], kwargs)
    assert mine.text == "[('ground_truth', '7'), ('k', 2)]" and other.text == "[]"


def test_no_calls_no_results():
    assert ToolRunner({}, 1, 1.0).run([]) == []


def test_a_tool_with_its_own_timeout_gets_it_plus_a_grace():
    probe = Probe()
    probe.timeout_s = 0.4  # e.g. code_interpreter's default_timeout: it stops the run itself
    runner = ToolRunner({"probe": probe}, max_parallel_calls=1, timeout_s=0.1)
    ok = runner.run([ToolCall("probe", {"mode": "sleep", "s": 0.3})])[0]
    assert ok.ok and ok.text == "slept 0.3"  # past the runner's 0.1 s, within the tool's own 0.4 s + 5 s
