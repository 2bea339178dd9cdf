"""The code_interpreter's local sandbox, through the tool (what the model would read): an infinite
loop ends at the timeout, a memory bomb and a bounded fork loop are stopped, writes land only in the
temporary directory, the environment is empty, no network, output is cut; each an error message,
and nothing the code started outlives the call.

Integration tier: every test starts sandbox processes (~0.2 s each). The fork tests fork at most 40
sleeping children, so even with every bound failing they cannot take the machine down, and the
sandbox's timeout still ends them.
"""

import json
import os
import socket
import time
from pathlib import Path

import pytest

from logicrl.tools.code_interpreter import CodeInterpreter
from logicrl.tools.sandbox import SandboxLimits, run_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]



@pytest.fixture(scope="module")
def isolation():
    """What this machine grants the sandbox (namespaces, cgroup), as its launcher reported it."""
    return run_python("pass", SandboxLimits(timeout_s=5)).isolation


def tool(**config):
    return CodeInterpreter({"default_timeout": 5, "memory_limit_mb": 256, "max_processes": 8,
                            "max_output_chars": 400, **config})


def alive_in(workdir: str) -> list[int]:
    """Processes whose working directory is (or was) `workdir`."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if os.readlink(f"/proc/{entry.name}/cwd").startswith(workdir):
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_success_and_an_exception():
    ok = tool().call({"code": "print(sum(range(10)))"})
    assert (ok.text, ok.ok, ok.error) == ("45\n", True, None)
    bad = tool().call({"code": "def f():\n    raise ValueError('boom')\nf()"})
    assert (bad.ok, bad.error) == (False, "exception")
    assert bad.text.startswith("Error (exception): Traceback") and bad.text.endswith("ValueError: boom\n")


def test_infinite_loop_ends_at_the_timeout_with_its_children():
    code = ("import os, time\nprint(os.getcwd(), flush=True)\n"
            "if os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"  # a child that leaves the group
            "while True:\n    pass\n")
    start = time.monotonic()
    result = tool(default_timeout=1).call({"code": code})
    assert 1.0 <= time.monotonic() - start < 4.0
    assert (result.ok, result.error) == (False, "timeout")
    assert result.text.startswith("Error (timeout): the code ran past 1 s and was stopped; its output until then:")
    workdir = result.text.splitlines()[1]
    assert "logicrl-sandbox-" in workdir and not Path(workdir).exists()  # the work directory is gone
    time.sleep(0.1)
    assert alive_in(workdir) == []


# A child that leaves the process group and double-forks, left sleeping when the program ends.
ESCAPEE = ("import os, time\nprint(os.getcwd(), flush=True)\n"
           "if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n    os._exit(0)\n"
           "time.sleep({})\n")


@pytest.mark.parametrize("sleep, timeout", [(0.2, 5), (30, 1)], ids=["program-ends", "timeout"])
def test_nothing_outlives_the_call_without_namespaces_or_cgroup(sleep, timeout):
    """The weakest machine: no namespace, no cgroup. The launcher is a subreaper and kills what is
    left; on a timeout the parent kills the launcher's whole tree."""
    run = run_python(ESCAPEE.format(sleep), SandboxLimits(timeout_s=timeout, use_cgroup=False,
                                                          use_namespaces=False))
    assert not run.isolation["pid_ns"] and not run.isolation["cgroup"] and run.timed_out == (sleep > timeout)
    time.sleep(0.2)
    assert alive_in(run.stdout.split()[0]) == []


def test_cpu_time_limit():
    result = tool(default_timeout=10, cpu_time_s=1).call({"code": "while True:\n    pass\n"})
    assert (result.ok, result.error) == (False, "limit") and "CPU time limit" in result.text


def test_memory_bomb_is_stopped():
    code = "blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))\n"
    start = time.monotonic()
    result = tool().call({"code": code})
    assert (result.ok, result.error) == (False, "limit") and time.monotonic() - start < 4.0
    assert result.text.startswith("Error (limit): the code ran out of memory (limit 256 MB)")


FORK_LOOP = """
import os, time
print(os.getcwd(), flush=True)
made = 0
for _ in range(40):  # bounded: a test must not be able to take the machine down if the limit fails
    try:
        pid = os.fork()
    except OSError as exc:
        print("fork refused:", exc.strerror, flush=True)
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    made += 1
    time.sleep(0.02)  # lets the watchdog see the count grow
print("forked", made, flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("mode", ["pids-cgroup", "watchdog", "cgroup-join-fails"])
def test_bounded_fork_loop_is_stopped(mode, isolation, monkeypatch, tmp_path):
    if mode == "pids-cgroup" and not isolation.get("cgroup"):
        pytest.skip("no pids cgroup can be made here; the watchdog case covers this machine")
    if mode == "cgroup-join-fails":  # a cgroup the launcher cannot join: the watchdog must take over
        monkeypatch.setattr("logicrl.tools.sandbox._make_cgroup", lambda processes: tmp_path / "absent")
    limits = SandboxLimits(timeout_s=10, processes=8, use_cgroup=mode != "watchdog")
    start = time.monotonic()
    run = run_python(FORK_LOOP, limits)
    assert run.limit_hit == "processes" and not run.timed_out
    assert time.monotonic() - start < 5.0  # stopped by the limit, not by the 10 s timeout
    lines = run.stdout.splitlines()
    if mode == "pids-cgroup":  # the kernel refused the 9th process (8 allowed, the launcher and init aside)
        assert lines[1:] == ["fork refused: Resource temporarily unavailable", "forked 7"]
    else:  # the watchdog killed the group soon after the count passed 8 (polling: a few more may start)
        assert "forked" not in run.stdout
    time.sleep(0.1)
    assert alive_in(lines[0]) == []
    text = tool(max_processes=8).call({"code": FORK_LOOP})
    assert (text.ok, text.error) == (False, "limit") and "started more than 8 processes" in text.text


def test_writes_land_only_in_the_work_directory(tmp_path, isolation):
    outside = tmp_path / "escaped.txt"
    code = (f"import os\nopen('inside.txt', 'w').write('x')\nprint(sorted(os.listdir('.')), os.getcwd())\n"
            f"open({str(outside)!r}, 'w').write('x')\n")
    result = tool().call({"code": code})
    listing, workdir = result.text.removeprefix("Error (exception): ").splitlines()[0].rsplit(" ", 1)
    assert listing == "['inside.txt', 'main.py']" and not Path(workdir).exists()
    if not isolation.get("read_only_fs"):
        pytest.skip("no mount namespace here: writes outside the work directory are not stopped (docs/tools.md)")
    assert (result.ok, result.error) == (False, "exception")
    assert result.text.endswith("Read-only file system: " + repr(str(outside)) + "\n") and not outside.exists()


def test_nothing_of_the_trainers_environment(monkeypatch):
    monkeypatch.setenv("LOGICRL_TEST_SECRET", "hunter2")
    result = tool().call({"code": "import json, os, sys\nprint(json.dumps([sorted(os.environ), sys.flags.isolated]))"})
    names, isolated = json.loads(result.text)
    # Only the three thread-pool pins the sandbox sets, and LC_CTYPE, which Python itself sets when it
    # starts under the C locale (PEP 538).
    assert set(names) - {"LC_CTYPE"} == {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}
    assert isolated == 1  # python -I


def test_no_network(isolation):
    if not isolation.get("net_ns"):
        pytest.skip("no network namespace here: the code has the machine's network (docs/tools.md)")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        result = tool().call({"code": code})
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()  # nothing reached the listener
    assert (result.ok, result.error) == (False, "exception") and "OSError" in result.text.splitlines()[-1]


def test_output_is_cut_in_the_middle():
    result = tool(max_output_chars=400).call({"code": "print('a' * 50000)\nprint('THE END')"})
    # 50,000 + 1 + 8 characters printed; 200 kept from each end: 49,609 cut.
    assert result.ok and result.text == "a" * 200 + "\n[... 49609 characters cut ...]\n" + "a" * 191 + "\nTHE END\n"
    both = tool(max_output_chars=400).call({"code": "import sys\nprint('o' * 500)\nsys.stderr.write('e' * 500)"})
    assert both.text == "o" * 200 + "\n[... 601 characters cut ...]\n" + "e" * 200


def test_file_size_limit():
    result = tool(max_file_mb=1).call({"code": "open('big', 'wb').write(b'x' * 2_000_000)"})
    assert (result.ok, result.error) == (False, "limit") and "past the size limit" in result.text


def test_root_keeps_no_capabilities_and_sees_no_devices(isolation):
    code = ("import os\nstatus = dict(l.split(':\\t') for l in open('/proc/self/status').read().splitlines() "
            "if ':\\t' in l)\nprint(status['CapEff'].strip(), status['CapBnd'].strip(), sorted(os.listdir('/dev')))")
    caps_eff, caps_bnd, devices = tool().call({"code": code}).text.split(" ", 2)
    assert caps_eff == caps_bnd == "0000000000000000"
    if not isolation.get("minimal_dev"):
        pytest.skip("no mount namespace here: the host's /dev is visible (docs/tools.md)")
    assert devices == "['fd', 'full', 'null', 'random', 'stderr', 'stdin', 'stdout', 'urandom', 'zero']\n"


def test_a_sandbox_that_cannot_start_is_its_own_error(monkeypatch, tmp_path):
    monkeypatch.setattr("logicrl.tools.sandbox.LAUNCHER", tmp_path / "missing_launcher.py")
    result = tool().call({"code": "print(1)"})
    assert (result.ok, result.error) == (False, "sandbox")
    assert result.text.startswith("Error (sandbox): the sandbox could not start the code: ")
    assert "missing_launcher.py" in result.text
