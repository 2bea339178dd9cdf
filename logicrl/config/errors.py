"""The config's error type: a BadInput (logicrl/errors.py) whose message names the key and the fix."""

import logging

from logicrl.errors import BadInput

log = logging.getLogger("logicrl.config")


class ConfigError(BadInput):
    pass
