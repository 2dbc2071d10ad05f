"""Keep the working directory out of what proctor imports.

``python -m proctor.cli`` (like any ``python -m``) puts the current directory first on
`sys.path`, so a ``litellm.py`` or ``rich.py`` left there would be imported instead of
the installed package the moment proctor lazily imports it. `cwd_not_importable`
takes every entry that names the current directory off `sys.path` while a command
runs; `import_from_cwd` resolves one module — the ``--tools`` module the user named —
from the current directory without putting the directory on `sys.path`, so nothing
that module or proctor imports afterwards can be shadowed by a file there.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator
from types import ModuleType

__all__ = ["cwd_not_importable", "import_from_cwd", "names_cwd"]


def names_cwd(entry: str, cwd: str | None = None) -> bool:
    """Whether a `sys.path` entry means the current directory ('' or a path to it)."""
    here = os.path.realpath(cwd or os.getcwd())
    if entry in ("", "."):
        return True
    try:
        return os.path.realpath(entry) == here
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def cwd_not_importable() -> Iterator[None]:
    """Within the block `sys.path` holds no entry for the current directory; restored afterwards."""
    removed = [(i, entry) for i, entry in enumerate(sys.path) if names_cwd(entry)]
    for i, _ in reversed(removed):
        del sys.path[i]
    try:
        yield
    finally:
        for i, entry in removed:
            if entry not in sys.path:
                sys.path.insert(min(i, len(sys.path)), entry)


def import_from_cwd(module_name: str) -> ModuleType:
    """Import `module_name` (``pkg.mod`` or ``mod``), its top-level name looked up in the current
    directory first, then on `sys.path`; the directory itself is never added to `sys.path`.

    A module already imported is returned as is. Raises `ModuleNotFoundError` as `import` would.
    """
    top = module_name.partition(".")[0]
    if top not in sys.modules:
        spec = importlib.machinery.PathFinder.find_spec(top, [os.getcwd()])
        if spec is not None:
            module = importlib.util.module_from_spec(spec)  # gives a namespace package its loader
            sys.modules[top] = module
            try:
                if spec.loader is not None:
                    spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(top, None)
                raise
    return importlib.import_module(module_name)
