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


def _imported(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The proctor modules an import statement loads (`from . import x` names module x when x is one)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parts = module.split(".") if is_package else module.split(".")[:-1]
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join([*parts, base] if base else parts)
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    found = []
    for target in targets:
        while target and target not in known:  # `import proctor.x.y as z` loads proctor.x.y; an attribute is no module
            target = target.rpartition(".")[0]
        if target and target != module:
            found.append(target)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    names = [n for n in ast.walk(test) if isinstance(n, (ast.Name, ast.Attribute))]
    return any((n.id if isinstance(n, ast.Name) else n.attr) == "TYPE_CHECKING" for n in names)


@functools.cache
def import_graph() -> tuple[dict[str, frozenset[str]], dict[str, frozenset[str]], dict[str, frozenset[str]]]:
    """(module level, inside functions, under `if TYPE_CHECKING:`): for each module, the proctor modules it imports.

    Module level is what runs when the module is imported: its top-level statements, the bodies of its
    classes, `try`/`with`/`if` blocks (the `else` of an `if TYPE_CHECKING:` included)."""
    known = set(module_names())
    graphs: tuple[dict[str, set[str]], dict[str, set[str]], dict[str, set[str]]] = ({}, {}, {})

    def visit(module: str, is_package: bool, nodes: list[ast.stmt], kind: int) -> None:
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graphs[kind].setdefault(module, set()).update(_imported(module, is_package, node, known))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(module, is_package, node.body, 1 if kind == 0 else kind)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                visit(module, is_package, node.body, 2)
                visit(module, is_package, node.orelse, kind)
            else:
                for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                    children = getattr(node, field, None)
                    if isinstance(children, list):
                        stmts = [c for child in children
                                 for c in (child.body if isinstance(child, (ast.ExceptHandler, ast.match_case))
                                           else [child]) if isinstance(c, ast.stmt)]
                        visit(module, is_package, stmts, kind)

    for name in known:
        tree, path = parsed(name), source_of(name)
        if tree is not None and path is not None:
            visit(name, path.name == "__init__.py", tree.body, 0)
    return tuple({m: frozenset(t) for m, t in g.items()} for g in graphs)  # type: ignore[return-value]


def cycles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
