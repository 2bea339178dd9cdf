"""Config: typed schemas, validation, migration of older verl keys, recipes.

Importing this package must stay cheap (no torch, no Ray): validation errors are promised in
well under 3 seconds.
"""

from logicrl.config.cli import check_overrides, compose
from logicrl.config.errors import ConfigError
from logicrl.config.plan import StepPlan
from logicrl.config.validate import validate

__all__ = ["StepPlan", "ConfigError", "check_overrides", "compose", "validate"]
