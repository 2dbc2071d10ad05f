"""Loading tools named on the command line: ``package.module:attr`` or a whole module.

- ``MOD:ATTR`` — ATTR is a `Tool`, a function (made a tool), or a list/tuple of them.
- ``MOD`` — every `Tool` defined at the top level of the module (``@tool`` functions).

The named module is looked up in the current directory first, so ``--tools examples.tools_demo``
works from a checkout; the directory itself is never put on `sys.path`, so a file there
(a ``litellm.py``, say) cannot shadow anything else proctor or the tools import
(`proctor.importpath`). A tools module that imports a sibling file must be a package.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
from collections.abc import Iterable
from typing import Any

from proctor.errors import ToolLoadError
from proctor.importpath import import_from_cwd
from proctor.tools import Tool, ToolDefinitionError, as_tool

__all__ = ["ToolLoadError", "load_tools"]


def _as_tool(obj: Any, where: str) -> Tool:
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        try:
            return as_tool(obj)
        except ToolDefinitionError as exc:
            raise ToolLoadError(f"{where}: {exc}") from None
    raise ToolLoadError(f"{where} is a {type(obj).__name__}, not a tool, a function or a list of them")


def _import(module_name: str) -> Any:
    try:
        return import_from_cwd(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ToolLoadError(f"cannot import {module_name!r}: no module named {exc.name!r} "
                                f"(run from the directory that contains it, or install it)") from None
        if exc.name and importlib.machinery.PathFinder.find_spec(exc.name.partition(".")[0], [os.getcwd()]):
            raise ToolLoadError(
                f"{module_name!r} imports {exc.name!r}, which is in the current directory: proctor resolves only "
                "the named tools module there (so no file can shadow what proctor imports); make them one "
                "package (a directory with __init__.py) or install it") from None
        raise ToolLoadError(f"cannot import {module_name!r}: {_failure(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the tools module itself failed at import: its error in one line
        raise ToolLoadError(f"cannot import {module_name!r}: {_failure(exc)}") from None


def _failure(exc: BaseException) -> str:
    """An import's error in one line, with the file and line where it happened."""
    import traceback

    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{exc.filename}:{exc.lineno}"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
        if frames:
            where = f"{frames[-1].filename}:{frames[-1].lineno}"
    text = (exc.msg if isinstance(exc, SyntaxError) else str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}" + (f" ({where})" if where else "")


def load_tools(specs: Iterable[str]) -> list[Tool]:
    """The tools named by `specs`, in order; a name given twice by different tools is an error."""
    tools: dict[str, Tool] = {}
    for spec in specs:
        module_name, sep, attr = spec.partition(":")
        if not module_name or (sep and not attr):
            raise ToolLoadError(f"--tools {spec!r}: expected MODULE or MODULE:ATTRIBUTE")
        module = _import(module_name)
        found: list[Tool]
        if attr:
            if not hasattr(module, attr):
                raise ToolLoadError(f"--tools {spec!r}: module {module_name!r} has no attribute {attr!r}")
            obj = getattr(module, attr)
            items = obj if isinstance(obj, (list, tuple)) else [obj]
            found = [_as_tool(item, f"--tools {spec}") for item in items]
        else:
            found = [v for v in vars(module).values() if isinstance(v, Tool)]
            if not found:
                raise ToolLoadError(f"--tools {spec!r}: module {module_name!r} defines no @tool functions")
        for t in found:
            existing = tools.get(t.name)
            if existing is not None and existing is not t:
                raise ToolLoadError(f"two different tools are named {t.name!r}")
            tools[t.name] = t
    if not tools:
        raise ToolLoadError("no tools given: pass --tools MODULE[:ATTRIBUTE]")
    return list(tools.values())
