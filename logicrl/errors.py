"""The one kind of error a user fixes by changing an input: a config key, a data file, a model
directory, the device, a directory, the cluster asked for.

Its message is one line naming the key, file, row or directory and the fix; main_ppo prints it
as `error: <message>` on stderr and exits 2, wherever it is raised (the preflight raises most of
them before Ray or a model starts; a few can only be found later, e.g. a row past the sampled
ones). Every package may raise it: this module is in the bottom layer.
"""

from __future__ import annotations


class BadInput(ValueError):
    def __init__(self, message: str):
        # One line, always: the console shows it as is.
        super().__init__(" ".join(message.split()))
