"""CEL's native module, `cel.cel`, imported on its own: what proctor's conditions use of CEL.

`common-expression-language`'s ``cel/__init__.py`` imports its command-line interface eagerly
(``cel.cli``: prompt_toolkit, typer, rich), most of ``import cel``'s time and most of
`proctor policy check`'s (docs/cel-upstream-report.md). Everything proctor calls (``compile``,
``Context``, ``OptionalValue``) is the package's native module, so this module imports that
module under its own name, ``cel.cel``, without running the package's ``__init__``. Nothing is
replaced or patched: a later ``import cel`` (the application's) runs the package as usual and
finds the same native module, so every class is the same class. Where ``cel.cel`` is already
imported, that module is used.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING

__all__ = ["cel"]

_NAME = "cel.cel"


def _native() -> ModuleType:
    loaded = sys.modules.get(_NAME)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("cel")  # (finds the package without importing it)
    spec = None
    if package is not None and package.submodule_search_locations:
        spec = importlib.machinery.PathFinder.find_spec(_NAME, list(package.submodule_search_locations))
    if spec is None or spec.loader is None:  # not installed as expected: the package's own import says why
        return importlib.import_module(_NAME)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sys.modules.setdefault(_NAME, module)


if TYPE_CHECKING:
    import cel.cel as cel
else:
    cel = _native()
