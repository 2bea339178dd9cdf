"""One run per checkpoint directory (logicrl/run_lock.py): flock on a file there. flock locks belong to
an open file, so a second open in this process stands for a second launch."""

from __future__ import annotations

import os
import socket

import pytest

from logicrl.errors import BadInput
from logicrl.run_lock import LOCK_FILE, one_run_per_directory


def test_a_second_holder_is_refused_naming_the_first_and_the_lock_frees_when_the_first_ends(tmp_path):
    ckpt = tmp_path / "ckpt"
    with one_run_per_directory(ckpt):
        assert (ckpt / LOCK_FILE).read_text().startswith(f"pid {os.getpid()} on {socket.gethostname()}, started ")
        with pytest.raises(BadInput) as refused, one_run_per_directory(ckpt):
            pass
        line = str(refused.value)
        assert line.startswith(f"trainer.default_local_dir={ckpt} is in use by another run (pid {os.getpid()} on "
                               f"{socket.gethostname()}, started ")
        assert "\n" not in line and "another trainer.default_local_dir" in line
    with one_run_per_directory(ckpt):  # released on leaving: a later run takes it
        pass


def test_the_lock_is_released_when_the_run_raises(tmp_path):
    with pytest.raises(RuntimeError), one_run_per_directory(tmp_path):
        raise RuntimeError("a failed run")
    with one_run_per_directory(tmp_path):
        pass
