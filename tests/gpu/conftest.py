"""The GPU tier (`make test-gpu`): every test under tests/gpu needs CUDA and skips cleanly without it.

Everything collected here is marked `gpu`, so a test that forgets the marker still stays out of the
default tier (pyproject.toml's addopts deselect `gpu`) and still skips on a machine without CUDA
(tests/conftest.py). vLLM allows one engine per process: a test that builds one runs it in its own
process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker, and before tests/conftest.py skips
def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(item.path).parents:
            item.add_marker(pytest.mark.gpu)
