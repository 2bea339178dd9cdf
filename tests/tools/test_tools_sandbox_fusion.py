"""code_interpreter pointed at an external sandbox service (verl's `sandbox_fusion_url`), against a
local fake server speaking SandboxFusion's run_code API: what is sent, and each kind of answer."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from logicrl.tools.code_interpreter import CodeInterpreter, RetoolCodeInterpreter, print_last_expression


class FakeFusion(BaseHTTPRequestHandler):
    """Answers by the code's first line; records every request body."""

    requests: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeFusion.requests.append((self.path, body))
        code = body["code"].splitlines()[0]
        if code == "#500":
            self.send_response(500)
            self.end_headers()
            return
        if code == "#garbage":
            answer = b"<html>oops</html>"
        else:
            run = {"status": "Finished", "stdout": "", "stderr": "", "return_code": 0, "execution_time": 0.01}
            status = "Success"
            if code == "#ok":
                run["stdout"] = "45\n"
            elif code == "#fail":
                run.update(stderr="Traceback (most recent call last):\nZeroDivisionError: division by zero\n",
                           return_code=1)
                status = "Failed"
            elif code == "#slow":
                run.update(status="TimeLimitExceeded", stdout="partial\n", return_code=None)
                status = "Failed"
            elif code == "#long":
                run["stdout"] = "x" * 1000
            elif code == "#broken":
                status, run = "SandboxError", None
            answer = json.dumps({"status": status, "message": "worker died" if run is None else "",
                                 "compile_result": None, "run_result": run}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeFusion)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    server.shutdown()


def remote(url, **config):
    return CodeInterpreter({"sandbox_fusion_url": url, "default_timeout": 3, "memory_limit_mb": 512,
                            "max_output_chars": 100, **config})


def test_request_and_success(url):
    FakeFusion.requests.clear()
    result = remote(url).call({"code": "#ok\nprint(sum(range(10)))"})
    assert (result.text, result.ok) == ("45\n", True)
    assert FakeFusion.requests == [("/run_code", {"code": "#ok\nprint(sum(range(10)))", "language": "python",
                                                  "run_timeout": 3.0, "compile_timeout": 3.0,
                                                  "memory_limit_MB": 512})]


@pytest.mark.parametrize("first_line, kind, text", [
    ("#fail", "exception", "Error (exception): Traceback (most recent call last):\nZeroDivisionError: division by "
                           "zero\n"),
    ("#slow", "timeout", "Error (timeout): the code ran past 3 s and was stopped; its output until then:\npartial\n"),
    ("#broken", "service", "Error (service): the sandbox service failed: worker died"),
    ("#garbage", "service", "Error (service): {url} answered something that is not JSON"),
    ("#500", "service", "Error (service): HTTP 500 from {url}"),
])
def test_failures(url, first_line, kind, text):
    FakeFusion.requests.clear()
    result = remote(url).call({"code": first_line})
    assert (result.ok, result.error, result.text) == (False, kind, text.format(url=url))
    assert len(FakeFusion.requests) == (2 if first_line == "#500" else 1)  # one retry on a 5xx


def test_output_cut_and_service_down(url):
    long = remote(url).call({"code": "#long"})
    assert long.ok and long.text == "x" * 50 + "\n[... 900 characters cut ...]\n" + "x" * 50
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/run_code"  # bound, not listening: refused
        down = remote(dead).call({"code": "#ok"})
    assert (down.ok, down.error) == (False, "service") and "did not answer" in down.text


def test_retool_extracts_the_code_block_and_prints_the_last_expression(url):
    FakeFusion.requests.clear()
    tool = RetoolCodeInterpreter({"sandbox_fusion_url": url})
    tool.call({"code": "#ok\nLet me compute:\n```python\n#ok\nx = 6\nx * 7\n```\nDone."})
    assert FakeFusion.requests[0][1]["code"] == "#ok\nx = 6\nprint(x * 7)"


@pytest.mark.parametrize("code, sent", [
    ("x = 1\nx + 1", "x = 1\nprint(x + 1)"), ("x = 1", "x = 1"), ("print(3)", "print(3)"),
    ("for i in range(2):\n    i", "for i in range(2):\n    i"), ("1 +", "1 +"),
    ("a = [1,\n  2]\nsum(a)  # total\n", "a = [1,\n  2]\nprint(sum(a))  # total"),
    ("é = 1; é * 2", "é = 1; print(é * 2)"),
])
def test_print_last_expression(code, sent):
    assert print_last_expression(code) == sent
