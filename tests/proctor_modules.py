"""Every module of the proctor package, found on disk (shared by the layout tests)."""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import pkgutil
from pathlib import Path
from types import ModuleType

import proctor

PACKAGE_DIR = Path(proctor.__file__).parent

#: The import names each optional extra of pyproject.toml brings, and the extra that brings them.
OPTIONAL_IMPORTS = {
    "opentelemetry": "otel", "litellm": "litellm", "smolagents": "smolagents", "mcp": "mcp",
    "redis": "redis", "hiredis": "redis", "psycopg": "postgres", "fastapi": "serve", "uvicorn": "serve",
    "jinja2": "serve", "multipart": "serve", "python_multipart": "serve", "jsonschema": "serve", "PIL": "images",
}


def module_names() -> list[str]:
    """Every module and package under proctor/, Python and native, in a stable order."""
    names: list[str] = []

    def walk(path: Path, prefix: str) -> None:
        for info in pkgutil.iter_modules([str(path)]):
            name = prefix + info.name
            names.append(name)
            if info.ispkg:
                walk(path / info.name, name + ".")

    names.append("proctor")
    walk(PACKAGE_DIR, "proctor.")
    return sorted(names)


def source_of(name: str) -> Path | None:
    """The .py file of a module (its __init__.py for a package); None for a native one."""
    rel = Path(*name.split(".")[1:])
    for candidate in (PACKAGE_DIR / rel / "__init__.py", (PACKAGE_DIR / rel).with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def import_or_absent_extra(name: str) -> ModuleType | str:
    """The module, or why it cannot be imported here: the optional extra it needs is not installed.

    Any other ImportError propagates: a module that fails to import for another reason is a bug."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        root = (exc.name or "").split(".")[0]
        if root in OPTIONAL_IMPORTS and importlib.util.find_spec(root) is None:
            return f"{name} needs {root!r}, from the [{OPTIONAL_IMPORTS[root]}] extra, which is not installed"
        raise


@functools.cache
def parsed(name: str) -> ast.Module | None:
    """The syntax tree of a module's source (None for a native module), parsed once per test session."""
    path = source_of(name)
    return None if path is None else ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
