"""The values a condition may see: CEL's converter is recursive and native, so a cyclic or absurdly deep value
would crash the host; `check_value` refuses one first (every path that hands values to CEL calls it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proctor.errors import ValueTooDeep

__all__ = ["MAX_CONTAINERS", "MAX_DEPTH", "check_value"]

MAX_DEPTH = 64
_FAST_CONTAINERS = (dict, list, tuple)
_SCALARS = (str, bytes, int, float, type(None))
#: Exact types that are never containers (a subclass of one takes the general path).
_FLAT = frozenset((str, bytes, int, float, bool, type(None)))


def _is_container(value: Any) -> bool:
    """Whether CEL's converter may recurse into `value` (any mapping or sequence but str/bytes)."""
    if isinstance(value, _FAST_CONTAINERS):
        return True
    return not isinstance(value, _SCALARS) and isinstance(value, (Mapping, Sequence))


MAX_CONTAINERS = 100_000


def check_value(value: Any) -> None:
    """Refuse values that would crash or stall CEL's (recursive, native) converter.

    A cyclic or very deeply nested argument makes the converter overflow its stack and
    kill the whole host process; so anything nested deeper than MAX_DEPTH, or holding
    more than MAX_CONTAINERS maps and lists, is refused here and the call is denied.
    """
    if value.__class__ is dict:  # most arguments: a flat dict of scalars, nothing to walk
        for child in value.values():
            if child.__class__ not in _FLAT:
                break
        else:
            return
    elif not _is_container(value):
        return
    left = MAX_CONTAINERS
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueTooDeep(f"a value is nested deeper than {MAX_DEPTH} levels (or is cyclic)")
        for child in node.values() if isinstance(node, Mapping) else node:
            if _is_container(child):
                left -= 1
                if left < 0:
                    raise ValueTooDeep(f"a value holds more than {MAX_CONTAINERS} maps and lists")
                stack.append((child, depth + 1))
