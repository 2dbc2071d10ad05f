"""Types of the optional C extension built from _newobj.c (see that file and proctor/_frozen.py)."""

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["maker"]

T = TypeVar("T")

def maker(cls: type[T], names: tuple[str, ...], defaults: tuple[Any, ...], /) -> Callable[..., T]: ...
