"""Worker side: shape a checked program so it behaves as smolagents users expect.

- The program's value is that of its last statement, as smolagents gives it: an
  expression's value, an assignment's assigned value (``x = 3`` gives 3), an augmented
  assignment's new value, and for an ``if``/``for``/``while``/``with``/``try``/``match``
  the last value that was not None among the statements its bodies ran.
- A bare ``assert`` fails with ``Assertion failed: <its expression>``.

The rewrite runs after `guard.check_program` has accepted the program, so the one name it
adds (``__proctor_note__``, a dunder the program itself cannot name) is never refused.
Standard library only (`_ast`, already loaded), as everything in the worker.
"""

from __future__ import annotations

import _ast

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

__all__ = ["NOTE", "describe_asserts", "note_last_value", "recorder"]

#: The namespace name of the function that records a value of the last statement.
NOTE = "__proctor_note__"

_BODIES = {"If": ("body", "orelse"), "For": ("body", "orelse"), "AsyncFor": ("body", "orelse"),
           "While": ("body", "orelse"), "With": ("body",), "AsyncWith": ("body",),
           "Try": ("body", "orelse", "finalbody"), "TryStar": ("body", "orelse", "finalbody")}


def recorder() -> tuple[list[Any], Callable[[Any], Any]]:
    """A box holding the last value that was not None, and the function that fills it."""
    box: list[Any] = [None]

    def note(value: Any) -> Any:
        if value is not None:
            box[0] = value
        return value

    return box, note


def note_last_value(tree: _ast.Module) -> None:
    """Rewrite the program's last statement (in place) to record its value through `NOTE`."""
    if tree.body:
        tree.body[-1:] = _noted(tree.body[-1])


def _noted(stmt: _ast.stmt) -> list[_ast.stmt]:
    if isinstance(stmt, _ast.Expr):
        stmt.value = _note(stmt.value)
        return [stmt]
    if isinstance(stmt, (_ast.Assign, _ast.AnnAssign)):
        if stmt.value is not None:
            stmt.value = _note(stmt.value)
        return [stmt]
    if isinstance(stmt, _ast.AugAssign):
        target = stmt.target
        again: _ast.expr
        if isinstance(target, _ast.Name):
            again = _ast.Name(id=target.id, ctx=_ast.Load())
        elif isinstance(target, _ast.Attribute):
            again = _ast.Attribute(value=target.value, attr=target.attr, ctx=_ast.Load())
        else:
            again = _ast.Subscript(value=target.value, slice=target.slice, ctx=_ast.Load())
        _place(again, stmt)
        return [stmt, _place(_ast.Expr(value=_note(again)), stmt)]
    kind = type(stmt).__name__
    for field in _BODIES.get(kind, ()):
        setattr(stmt, field, _all_noted(getattr(stmt, field)))
    if isinstance(stmt, _ast.Try) or kind == "TryStar":
        for handler in stmt.handlers:  # type: ignore[attr-defined]
            handler.body = _all_noted(handler.body)
    if isinstance(stmt, _ast.Match):
        for case in stmt.cases:
            case.body = _all_noted(case.body)
    return [stmt]


def _all_noted(body: list[_ast.stmt]) -> list[_ast.stmt]:
    out: list[_ast.stmt] = []
    for stmt in body:
        out.extend(_noted(stmt))
    return out


def _note(value: _ast.expr) -> _ast.expr:
    call = _ast.Call(func=_ast.Name(id=NOTE, ctx=_ast.Load()), args=[value], keywords=[])
    _place(call.func, value)
    _place(call, value)
    return call


def _place(node: Any, ref: Any) -> Any:
    for attr in ("lineno", "col_offset", "end_lineno", "end_col_offset"):
        setattr(node, attr, getattr(ref, attr, None) if attr.startswith("end") else getattr(ref, attr, 0))
    return node


def describe_asserts(tree: _ast.AST, code: str) -> None:
    """Give every bare ``assert`` the message ``Assertion failed: <its expression's source>``."""
    lines: list[str] | None = None
    todo: list[_ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, _ast.Assert) and node.msg is None:
            if lines is None:
                lines = code.splitlines()
            text = _segment(lines, node.test) or "the assertion"
            node.msg = _place(_ast.Constant(value=f"Assertion failed: {text}"), node.test)
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                todo.extend(v for v in value if isinstance(v, _ast.AST))
            elif isinstance(value, _ast.AST):
                todo.append(value)


def _segment(lines: list[str], node: Any) -> str | None:
    """The source text of `node` (its offsets count UTF-8 bytes), as `ast.get_source_segment`."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    start, end = node.col_offset, node.end_col_offset
    if end is None or not 0 <= first <= last < len(lines):
        return None
    chunk = [line.encode() for line in lines[first:last + 1]]
    if first == last:
        return chunk[0][start:end].decode(errors="replace")
    chunk[0], chunk[-1] = chunk[0][start:], chunk[-1][:end]
    return b"\n".join(chunk).decode(errors="replace")
