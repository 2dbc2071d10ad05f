"""`quick_init`: the same frozen dataclass, built in half the time.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__``,
which looks the name up on the class every time: for the records the gate makes on
every call (`CallRecord`, `HistoryEntry`, `CallOutcome`, `Redacted`) that was a fifth of
the gate's own cost. With slots, each field is a member descriptor on the class, and
calling its ``__set__`` directly stores the value without the lookup — what
``object.__setattr__`` ends up doing anyway. The class stays exactly as frozen: only
``__init__`` changes, with the same parameters, defaults and order.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["quick_init"]

T = TypeVar("T")


def quick_init(cls: type[T]) -> type[T]:
    """Give a ``@dataclass(frozen=True, slots=True)`` class a faster ``__init__`` (same signature)."""
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    if not params.frozen or "__slots__" not in cls.__dict__ or hasattr(cls, "__post_init__"):
        raise TypeError(f"quick_init needs a frozen slots dataclass without __post_init__, not {cls.__name__}")
    env: dict[str, Any] = {}
    args: list[str] = []
    body: list[str] = []
    for f in fields:
        if not f.init or f.kw_only or f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"quick_init: field {cls.__name__}.{f.name} is keyword-only, init=False "
                            "or has a default factory")
        if f.default is dataclasses.MISSING:
            args.append(f.name)
        else:
            env[f"_default_{f.name}"] = f.default
            args.append(f"{f.name}=_default_{f.name}")
        env[f"_set_{f.name}"] = cls.__dict__[f.name].__set__
        body.append(f"    _set_{f.name}(self, {f.name})")
    source = f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"]) + "\n"
    exec(source, env)
    init = env["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
