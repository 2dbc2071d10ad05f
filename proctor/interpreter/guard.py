"""Defense in depth inside the worker: an AST check, guarded builtins, an import allow-list.

None of this is the security boundary — the sandbox (and the host, which gates every
request) is. These layers stop the easy escapes early and tell the model, in one line,
what it may do instead. Runs inside the worker: standard library only.
"""

from __future__ import annotations

import _ast
import builtins
import re
import sys
import types

from proctor.errors import InterpreterError

TYPE_CHECKING = False  # typing is not imported at run time: the worker starts faster without it
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any

__all__ = [
    "DEFAULT_IMPORTS",
    "ImportPolicy",
    "InterpreterError",
    "check_program",
    "safe_builtins",
]

#: smolagents' default allow-list.
DEFAULT_IMPORTS = (
    "collections", "datetime", "itertools", "math", "queue", "random", "re", "stat", "statistics", "time",
    "unicodedata",
)

# Dunder attributes model code legitimately uses; every other dunder is refused.
_ALLOWED_DUNDERS = frozenset(
    "__init__ __name__ __qualname__ __doc__ __class__ __module__ __len__ __str__ __repr__ __iter__ __next__ "
    "__enter__ __exit__ __call__ __getitem__ __setitem__ __delitem__ __contains__ __eq__ __ne__ __lt__ __le__ "
    "__gt__ __ge__ __hash__ __bool__ __add__ __sub__ __mul__ __truediv__ __floordiv__ __mod__ __pow__ __neg__ "
    "__pos__ __abs__ __and__ __or__ __xor__ __radd__ __rsub__ __rmul__ __rtruediv__ __version__ __all__ "
    "__annotations__ __slots__ __file__ __post_init__ __format__ __round__ __int__ __float__".split()
)
# Non-dunder attributes that reach frames, code or globals.
_BLOCKED_ATTRS = frozenset(
    "gi_frame gi_code gi_yieldfrom cr_frame cr_code cr_await ag_frame ag_code ag_await tb_frame tb_next "
    "f_back f_globals f_locals f_builtins f_code f_trace co_code co_consts co_names mro func_globals".split()
)
_ALLOWED_DUNDER_NAMES = frozenset({"__name__", "__doc__"})
_FORMAT_WALK = re.compile(r"\{[^{}]*[.\[](_|gi_|cr_|ag_|tb_|f_|co_)")
#: Standard-library modules that allowed modules' C code imports lazily, on the program's behalf
#: (``time.strptime`` loads ``_strptime``, ``copy`` of an object loads ``copyreg``, codecs load ``encodings``).
_STDLIB_HELPERS = ("_strptime", "copyreg", "encodings")
_PROCTOR_ERRORS = ("ProctorError", "CallRefused", "ToolDenied", "ApprovalDenied", "ApprovalTimeout",
                   "BudgetExceeded", "ToolFailed", "ToolOutcomeUnknown", "AuditError")


def attribute_allowed(name: str) -> bool:
    """Whether generated code may read or write attribute `name` (by syntax or via getattr)."""
    if name.startswith("__") and name.endswith("__"):
        return name in _ALLOWED_DUNDERS
    return name not in _BLOCKED_ATTRS


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _walk(tree: _ast.AST) -> Iterator[_ast.AST]:
    """Every node of `tree` (the `ast` module costs start-up time; `_ast` is already loaded)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                todo.extend(v for v in value if isinstance(v, _ast.AST))
            elif isinstance(value, _ast.AST):
                todo.append(value)


def check_program(tree: _ast.AST) -> None:
    """Refuse programs that name frames, code objects, globals or most dunders."""
    for node in _walk(tree):
        if isinstance(node, _ast.Attribute) and not attribute_allowed(node.attr):
            raise _refusal(node, f"access to attribute {node.attr!r} is not allowed")
        if isinstance(node, _ast.Name) and node.id.startswith("__") and node.id.endswith("__"):
            if node.id not in _ALLOWED_DUNDER_NAMES:
                raise _refusal(node, f"the name {node.id!r} is not available")
        if (isinstance(node, _ast.Call) and isinstance(node.func, _ast.Attribute)
                and node.func.attr in ("format", "format_map") and isinstance(node.func.value, _ast.Constant)
                and isinstance(node.func.value.value, str) and _FORMAT_WALK.search(node.func.value.value)):
            raise _refusal(node, "format strings may not reach private attributes")


def _refusal(node: _ast.AST, message: str) -> InterpreterError:
    line = getattr(node, "lineno", None)
    err = InterpreterError(message)
    err.lineno = line  # type: ignore[attr-defined]
    return err


class ImportPolicy:
    """Which modules a program may import: exact names, ``pkg.*`` for a package and its submodules, ``*``."""

    def __init__(self, authorized: Iterable[str]) -> None:
        names = set(DEFAULT_IMPORTS) | set(authorized)
        self.everything = "*" in names
        self.exact = {n for n in names if not n.endswith(".*") and n != "*"}
        self.prefixes = tuple(n[:-2] for n in names if n.endswith(".*"))
        self.listing = ", ".join(sorted(names))
        self._views: dict[int, types.ModuleType] = {}

    def allows(self, name: str) -> bool:
        if self.everything or name in self.exact or name == "proctor.errors":
            return True
        return any(name == p or name.startswith(p + ".") for p in self.prefixes)

    def allows_internal(self, name: str) -> bool:
        """Whether C code of an allowed module may import `name` while the program runs: a module of an
        allowed package (``numpy._core._methods`` for ``numpy``), or a standard helper such imports need.

        Only C code reaches the guard this way: Python code of a package runs with the real builtins.
        C code imports through the builtins of the Python frame on top, the program's, and so arrives
        here; what it imports goes to that C code (`PyImport_Import` returns ``sys.modules[name]``), not
        to the program, which still names every module it gets in an import statement of its own.
        """
        top = name.partition(".")[0]
        if top in _STDLIB_HELPERS or self.allows(name) or self.allows(top):
            return True
        return any(p.partition(".")[0] == top for p in self.prefixes)

    def make_import(self, real_import: Callable[..., Any]) -> Callable[..., Any]:
        """A guarded ``__import__`` for the program's builtins."""

        def guarded_import(name: str, globals: Any = None, locals: Any = None,
                           fromlist: Any = (), level: int = 0) -> Any:
            if level:
                raise ImportError("relative imports are not allowed in the program")
            if not self.allows(name):
                if not _from_import_statement() and self.allows_internal(name):
                    # An allowed module's C code: `PyImport_Import` returns sys.modules[name] to it, not this
                    # value; whoever else might hold this function gets the filtered view, as ever.
                    real_import(name, None, None, (), 0)
                    return self.view(sys.modules[name])
                raise ImportError(f"Import of {name!r} is not allowed; allowed modules: {self.listing}")
            module = real_import(name, None, None, fromlist, 0)
            if self.everything:
                return module
            if fromlist:
                return self.view(module)
            top = real_import(name.partition(".")[0], None, None, (), 0)
            return self.view(top)

        return guarded_import

    def view(self, module: types.ModuleType) -> types.ModuleType:
        """A copy of `module` without private names or unrelated modules (e.g. ``random._os``)."""
        cached = self._views.get(id(module))
        if cached is not None and cached.__dict__.get("__proctor_size__") == len(module.__dict__):
            return cached
        name = module.__name__
        full = self.allows(name)
        top = name.partition(".")[0]
        policy = self

        def admit(attr: str, value: Any) -> Any:
            # Private names stay out; public dunders (``__version__``, ``__all__``…) are let through.
            if (attr.startswith("_") and not _is_dunder(attr)) or not attribute_allowed(attr):
                raise AttributeError(attr)
            if isinstance(value, types.ModuleType):
                sub = value.__name__
                if sub.startswith(top + ".") or policy.allows(sub):
                    return policy.view(value)
                raise AttributeError(attr)
            if not full:
                raise AttributeError(attr)
            return value

        class ModuleView(types.ModuleType):
            def __getattr__(self, attr: str) -> Any:  # names the real module creates lazily
                try:
                    return admit(attr, getattr(module, attr))
                except AttributeError:
                    if f"{name}.{attr}" in sys.modules:
                        # ``from pkg import _sub``: on an AttributeError CPython's IMPORT_FROM falls back to
                        # sys.modules["pkg._sub"], the real module, past this view. Any other error stops it.
                        raise ImportError(f"cannot import name {attr!r} from {name!r}: not available "
                                          "here") from None
                    raise AttributeError(f"module {name!r} has no attribute {attr!r} available here") from None

        view = ModuleView(name, module.__doc__)
        view.__dict__["__proctor_size__"] = len(module.__dict__)  # before filling: modules import each other
        self._views[id(module)] = view
        for attr, value in list(module.__dict__.items()):
            if isinstance(value, types.ModuleType) and value is module:
                continue
            try:
                setattr(view, attr, admit(attr, value))
            except AttributeError:
                continue
        return view


def _from_import_statement() -> bool:
    """Whether the import under way is the program's own ``import`` statement (else C code making it).

    The guarded ``__import__`` is reached only from frames running with the program's builtins. The
    frame above it is then either at an ``IMPORT_NAME`` instruction (the program's ``import``) or at
    some other one (a call into C code that imports, e.g. ``np.arange(5).sum()``). Anything unclear
    counts as the program's own import, which is checked.
    """
    try:
        import inspect
        import opcode  # only on this path, a refused name: worker start-up does not pay for it

        here = inspect.currentframe()  # this function's; then guarded_import's; then who imports
        caller = here.f_back if here is not None else None
        frame = caller.f_back if caller is not None else None
        if frame is None:  # no frames to read (not CPython): checked as the program's own
            return True
        lasti = frame.f_lasti
        return lasti < 0 or frame.f_code.co_code[lasti] == opcode.opmap["IMPORT_NAME"]
    except (ImportError, ValueError, IndexError, AttributeError, KeyError):
        return True


def _unavailable(name: str, hint: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise InterpreterError(f"{name}() is not available in the program{hint}")

    refuse.__name__ = name
    return refuse


def _checked_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError("attribute name must be a string")
    if not attribute_allowed(name):
        raise InterpreterError(f"access to attribute {name!r} is not allowed")
    return name


def _getattr(obj: Any, name: str, *default: Any) -> Any:
    return getattr(obj, _checked_name(name), *default)


def _hasattr(obj: Any, name: str) -> bool:
    return hasattr(obj, _checked_name(name))


def _setattr(obj: Any, name: str, value: Any) -> None:
    setattr(obj, _checked_name(name), value)


def _delattr(obj: Any, name: str) -> None:
    delattr(obj, _checked_name(name))


_SAFE = (
    "abs all any ascii bin bool bytearray bytes callable chr classmethod complex dict dir divmod enumerate "
    "filter float format frozenset hash hex id int isinstance issubclass iter len list map max min next "
    "object oct ord pow print property range repr reversed round set slice sorted staticmethod str sum super "
    "tuple type zip memoryview aiter anext True False None NotImplemented Ellipsis __build_class__".split()
)


def safe_builtins(imports: ImportPolicy, errors: dict[str, type], *, allow_open: bool) -> dict[str, Any]:
    """The builtins the program sees: no eval/exec/compile/globals/vars, guarded getattr and import."""
    real = vars(builtins)
    table: dict[str, Any] = {name: real[name] for name in _SAFE if name in real}
    for name, value in real.items():
        if isinstance(value, type) and issubclass(value, BaseException):
            table[name] = value
    table.update(getattr=_getattr, hasattr=_hasattr, setattr=_setattr, delattr=_delattr)
    table["__import__"] = imports.make_import(builtins.__import__)
    for name in ("eval", "exec", "compile", "globals", "locals", "vars", "breakpoint", "input", "help"):
        table[name] = _unavailable(name, "")
    if allow_open or imports.everything:
        table["open"] = real["open"]
    else:
        table["open"] = _unavailable("open", " in process-only isolation (no sandbox filesystem)")
    table["__name__"] = "builtins"
    table["InterpreterError"] = InterpreterError
    for name in _PROCTOR_ERRORS:
        if name in errors:
            table[name] = errors[name]
    return table
