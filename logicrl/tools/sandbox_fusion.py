"""A client for an external code sandbox speaking SandboxFusion's `run_code` API, the service verl's
`sandbox_fusion_url` points at (e.g. http://host:8080/run_code):

    POST {"code", "language": "python", "run_timeout", "compile_timeout", "memory_limit_MB"}
    ->   {"status": "Success" | "Failed" | "SandboxError", "message",
          "run_result": {"status": "Finished" | "TimeLimitExceeded" | ..., "stdout", "stderr", "return_code"}}

Standard library only (urllib). A service that does not answer, answers garbage or reports its own
error becomes a "service" tool error; one retry on a connection error or a 5xx, as services wedge
under load (verl reports read timeouts even at low concurrency).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass


@dataclass(frozen=True)
class FusionAnswer:
    stdout: str
    stderr: str
    return_code: int | None
    timed_out: bool
    service_error: str | None  # set when the service, not the code, failed


def run_remote(url: str, code: str, timeout_s: float, memory_mb: int, retries: int = 1) -> FusionAnswer:
    body = json.dumps({"code": code, "language": "python", "run_timeout": timeout_s, "compile_timeout": timeout_s,
                       "memory_limit_MB": memory_mb}).encode()
    last = "no attempt"
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(0.2 * attempt)
        request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
        try:
            # The service's own run timeout plus room for its queue and start-up.
            with urllib.request.urlopen(request, timeout=timeout_s + 10) as response:
                return _answer(json.loads(response.read().decode("utf-8", "replace")))
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code} from {url}"
            if exc.code < 500:
                break
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            last = f"{url} did not answer ({getattr(exc, 'reason', exc)})"
        except ValueError:
            last = f"{url} answered something that is not JSON"
            break
    return FusionAnswer("", "", None, False, last)


def _answer(doc: object) -> FusionAnswer:
    if not isinstance(doc, dict):
        return FusionAnswer("", "", None, False, "the sandbox service answered a non-object")
    run = doc.get("run_result")
    compiled = doc.get("compile_result") if isinstance(doc.get("compile_result"), dict) else {}
    if doc.get("status") == "SandboxError" or not isinstance(run, dict):
        return FusionAnswer("", "", None, False, f"the sandbox service failed: {doc.get('message') or doc}"[:300])
    stdout = (compiled.get("stdout") or "") + (run.get("stdout") or "")
    stderr = (compiled.get("stderr") or "") + (run.get("stderr") or "")
    return FusionAnswer(stdout=stdout, stderr=stderr, return_code=run.get("return_code"),
                        timed_out=run.get("status") == "TimeLimitExceeded", service_error=None)
