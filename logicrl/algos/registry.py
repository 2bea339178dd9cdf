"""One registry per config switch: a name from the config picks an implementation (STYLE.md, 2).

Each switch gets its own `Registry`: ADV_ESTIMATORS, POLICY_LOSSES, AGG_MODES, KL_ESTIMATORS and
KL_CONTROLLERS. Its names are the strings the config accepts: one torch-free list per switch in
logicrl/algo_names.py, which logicrl/config/schema.py validates against up front.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

Impl = TypeVar("Impl")


class Registry(dict):
    """`name -> implementation` for one config switch.

    A plain dict, so `sorted(REG)` and `name in REG` work as usual. Looking up an unknown name raises
    a KeyError that names the switch and lists the known names, so a typo in a config is one read
    away from its fix.

    `inputs`, when given, is every argument name the switch's dispatcher can pass. An implementation
    declares the subset it needs by its parameter names and `call` passes exactly those: GAE takes
    `values`, GRPO takes `index`, and neither has to accept and silently ignore the other's
    arguments. A parameter outside `inputs` is refused at registration, so a misspelt name fails on
    import rather than arriving as a default forever.

    `names` is the switch's list in logicrl/algo_names.py: a name registered that it lacks (a user's
    own loss) is added to it, so the config's validation accepts that name too.
    """

    def __init__(self, switch: str, inputs: Iterable[str] | None = None, names: list[str] | None = None):
        super().__init__()
        self.switch = switch
        self.inputs = frozenset(inputs) if inputs is not None else None
        self.names = names

    def register(self, name: str) -> Callable[[Impl], Impl]:
        """Decorator: make `impl` the implementation selected by `name`."""

        def decorator(impl: Impl) -> Impl:
            # Replacing an implementation silently would change what every run with this name does.
            if name in self:
                raise ValueError(f"{self.switch} {name!r} is already registered ({dict.__getitem__(self, name)!r})")
            if self.inputs is not None:
                unknown = sorted(set(_parameters(impl)) - self.inputs)
                if unknown:
                    raise TypeError(
                        f"{self.switch} {name!r} declares {unknown}, which its dispatcher never passes; "
                        f"parameters must come from {sorted(self.inputs)}"
                    )
            dict.__setitem__(self, name, impl)
            if self.names is not None and name not in self.names:
                self.names.append(name)
            return impl

        return decorator

    def __missing__(self, name: str) -> Any:
        raise KeyError(f"unknown {self.switch} {name!r}; known: {sorted(self)}")

    def call(self, name: str, **inputs: Any) -> Any:
        """Run the implementation for `name` with the inputs it declares (None means "not given")."""
        impl = self[name]
        params = _parameters(impl)
        missing = [p for p, param in params.items() if param.default is param.empty and inputs.get(p) is None]
        if missing:
            raise TypeError(f"{self.switch}={name!r} needs {missing}, which the caller did not pass")
        return impl(**{p: inputs[p] for p in params if inputs.get(p) is not None})


def _parameters(impl: Any) -> dict[str, inspect.Parameter]:
    params = dict(inspect.signature(impl).parameters)
    variadic = [p for p, param in params.items() if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD)]
    if variadic:
        # *args/**kwargs would hide which inputs the implementation really reads.
        raise TypeError(f"{impl!r} takes {variadic}; registered implementations name each argument")
    return params
