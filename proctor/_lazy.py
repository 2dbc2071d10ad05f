"""Lazy package exports (PEP 562): a package names what it exports and where it lives,
and nothing is imported until a name is first used.

`import proctor` must not pay for CEL, rich, cryptography, the agents or an OpenTelemetry
SDK (issue #18: start-up); each package's ``__init__`` therefore lists its exports as
``{name: module}`` and calls `install`. Type checkers read the same names from an
``if TYPE_CHECKING:`` block. A resolved name is cached in the package's namespace, so
only the first access pays; `dir()` lists every export.

One subtlety: importing a submodule sets it as an attribute of its package, which would
hide an export of the same name (``proctor.audit.verify`` is a function *and* a module).
The package's module type refuses that one assignment, so the export wins, as it did
when the package imported it eagerly.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping
from typing import Any

__all__ = ["install"]


class _LazyModule(types.ModuleType):
    """A package whose exports are imported on first use."""

    def __getattr__(self, name: str) -> Any:
        exports: dict[str, str] = self.__dict__.get("_lazy_exports", {})
        target = exports.get(name)
        if target is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(target), name)
        self.__dict__[name] = value
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(self.__dict__) | set(self.__dict__.get("_lazy_exports", {})))

    def __setattr__(self, name: str, value: Any) -> None:
        exports: dict[str, str] = self.__dict__.get("_lazy_exports", {})
        if name in exports and isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{name}":
            return  # a submodule named like an export: the export keeps the name
        super().__setattr__(name, value)


def install(package: str, exports: Mapping[str, str]) -> None:
    """Make `package` resolve each of `exports` (name -> module defining it) on first use."""
    module = sys.modules[package]
    module.__dict__["_lazy_exports"] = dict(exports)
    module.__class__ = _LazyModule
