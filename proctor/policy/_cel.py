"""Import the `cel` package without its command-line interface (a start-up workaround).

`common-expression-language`'s ``cel/__init__.py`` imports ``cel.cli`` eagerly, which pulls in
prompt_toolkit, typer and rich: most of ``import cel``'s time (~60 ms of a ~70 ms import on an idle
machine; see docs/cel-upstream-report.md). proctor only needs the native module ``cel.cel``. So,
before anything in proctor imports ``cel``, `install` puts in ``sys.modules`` a package module
for ``cel`` that is not executed: its names (``compile``, ``Context``…) come from the native
module the first time one is read, and ``cel.cli`` / ``cel.stdlib`` still import on demand.
If ``cel`` is already imported (by the application), nothing changes.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

__all__ = ["install"]


def install() -> None:
    """Make ``import cel`` cheap: the package without its ``__init__`` (idempotent, thread-safe enough:
    the import lock serialises the first real import)."""
    if "cel" in sys.modules:
        return
    spec = importlib.util.find_spec("cel")
    if spec is None or not spec.submodule_search_locations:
        return  # not installed as expected: let `import cel` fail or succeed on its own
    package = types.ModuleType("cel", "CEL (native module loaded on first use by proctor.policy._cel)")
    package.__spec__ = spec
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    package.__package__ = "cel"

    def __getattr__(name: str) -> Any:
        if name in ("cli", "stdlib", "cel"):
            return importlib.import_module(f"cel.{name}")
        native = importlib.import_module("cel.cel")
        exported = getattr(native, "__all__", None) or [n for n in dir(native) if not n.startswith("_")]
        for item in exported:
            package.__dict__.setdefault(item, getattr(native, item))
        if name in package.__dict__:
            return package.__dict__[name]
        raise AttributeError(f"module 'cel' has no attribute {name!r}")

    package.__getattr__ = __getattr__  # type: ignore[method-assign]
    sys.modules["cel"] = package
