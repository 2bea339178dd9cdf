"""The one error type the preflight raises: its message is a single line naming the key and the fix."""

import logging

log = logging.getLogger("logicrl.config")


class ConfigError(ValueError):
    def __init__(self, message: str):
        # One line, always: main_ppo prints it as is and exits 2.
        super().__init__(" ".join(message.split()))
