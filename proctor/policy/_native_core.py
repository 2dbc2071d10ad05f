"""Load pydantic_core's native module without its package ``__init__`` (a start-up workaround).

``import pydantic_core`` runs its ``__init__``, which imports ``core_schema`` (a 175 KB module of
TypedDicts for building schemas by hand) and typing_extensions: ~40 ms of `proctor policy check`,
which only needs the native validator (``pydantic_core._pydantic_core``: SchemaValidator,
ValidationError, PydanticCustomError). `install` loads that extension module under its own name,
alone; a later ``import pydantic_core`` (pydantic, a user's tools) finds it in ``sys.modules`` and
uses the same module, so every class is the same class. Call it only where no other thread can be
importing (the `proctor` command's start-up): it does not take the import system's module lock.
If pydantic_core is already imported, or not installed as expected, nothing changes.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys

__all__ = ["install"]

NAME = "pydantic_core._pydantic_core"


def install() -> None:
    """Put pydantic_core's native module in ``sys.modules`` without importing its package (idempotent)."""
    if NAME in sys.modules or "pydantic_core" in sys.modules:
        return
    package = importlib.util.find_spec("pydantic_core")
    if package is None or not package.submodule_search_locations:
        return  # let `import pydantic_core` fail or succeed on its own
    spec = importlib.machinery.PathFinder.find_spec(NAME, list(package.submodule_search_locations))
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[NAME]
        raise
