"""`quick_init`: the same frozen dataclass, built in half the time; `builder`: in a twentieth.

A frozen dataclass's generated ``__init__`` sets each field with ``object.__setattr__``,
which looks the name up on the class every time: for the records the gate makes on
every call (`CallRecord`, `HistoryEntry`, `CallOutcome`, `Redacted`) that was a fifth of
the gate's own cost. With slots, each field is a member descriptor on the class, and
calling its ``__set__`` directly stores the value without the lookup — what
``object.__setattr__`` ends up doing anyway. The class stays exactly as frozen: only
``__init__`` changes, with the same parameters, defaults and order.

`builder(cls)` goes further for the few objects of every tool call: a callable that makes the
instance from positional field values without calling ``__init__`` at all (the optional C module
`proctor._newobj`; without it, the class itself). A `CallRecord` costs 1.1k instructions that
way against 9.4k through its (quick) ``__init__`` (callgrind, in-process loop of 4,000).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

try:
    from proctor._newobj import maker as _maker
except ImportError:  # the C extension is optional: the classes are called as usual
    _maker = None  # type: ignore[assignment]

__all__ = ["builder", "quick_init", "slot_builder"]

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """A callable equal to `cls` (a `quick_init` class) for positional arguments, that skips ``__init__``
    (whose only work is storing them). Keyword arguments, or a wrong count, go to `cls` itself, and so
    does every call without `proctor._newobj`."""
    if not getattr(cls.__dict__.get("__init__"), "_quick_init", False):
        raise TypeError(f"builder needs a quick_init class, not {cls.__name__}")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    defaults = tuple(f.default for f in fields if f.default is not dataclasses.MISSING)
    if _maker is None:
        return cls
    return slot_builder(cls, tuple(f.name for f in fields), defaults)


def slot_builder(cls: type[T], names: tuple[str, ...], defaults: tuple[Any, ...] = ()) -> Callable[..., T]:
    """A callable setting slots `names` of a new `cls` (its own or a base's) from its positional arguments
    (the trailing ones may be left to `defaults`), every other slot unset, without calling ``__init__``.
    Without `proctor._newobj`, a Python function doing the same through the slots' descriptors."""
    if _maker is not None:
        return _maker(cls, names, defaults)
    env: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    params: list[str] = []
    body: list[str] = []
    first_default = len(names) - len(defaults)
    for i, name in enumerate(names):
        env[f"_set_{i}"] = getattr(cls, name).__set__
        if i >= first_default:
            env[f"_default_{i}"] = defaults[i - first_default]
        params.append(f"a{i}" if i < first_default else f"a{i}=_default_{i}")
        body.append(f"    _set_{i}(obj, a{i})")
    source = f"def build({', '.join(params)}):\n    obj = _new(_cls)\n" + "\n".join(body) + "\n    return obj\n"
    exec(source, env)
    build: Callable[..., T] = env["build"]
    return build


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
    init._quick_init = True  # it only stores its arguments: `builder` may skip it
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
