"""`let:` — named CEL expressions defined once at the top of a policy, usable in every `when`.

```yaml
let:
  outbound: "tool in ['send_email', 'send_money', 'post_webpage']"
  injected_recipient: "'untrusted' in provenance(args.recipient) && !from_user(args.recipient)"
rules:
  - name: injected
    match: {side_effect: [external, destructive]}
    when: "outbound && injected_recipient"
    decision: require_approval
```

A name is an identifier that is neither a condition variable, a function, nor a CEL
keyword; an expression may use the variables, the functions, and other names (a cycle is
a load error). Each use is replaced by the named expression in parentheses before the
condition is compiled, so a name means exactly what its expression means where it is used
(history aggregates stay incremental, a failing name fails the condition using it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from proctor.policy.conditions import VARIABLES, ConditionError, compile_expression, known_functions

__all__ = ["LET_NAME", "MAX_EXPANDED", "RESERVED", "check_lets", "expand", "names_used"]

#: Longest text a condition may grow to once its names are replaced: names used several times inside
#: other names multiply (20 lines of `a: "b + b"` would be a million copies), so past this it is an error.
MAX_EXPANDED = 100_000

LET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: CEL's reserved words and literals, which no name may take.
RESERVED = frozenset({
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if",
    "import", "let", "loop", "package", "namespace", "return", "var", "void", "while",
    "int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type", "dyn",
    "has",  # the one global macro: `has(args.x)` must keep meaning it
})  # fmt: skip
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MACRO_VAR = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")


def _identifiers(source: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of each identifier of `source` that names something: outside string literals,
    not a field (after `.`), not a function (before `(`)."""
    out: list[tuple[int, int, str]] = []
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch in "'\"":
            quote = source[i : i + 3] if source[i : i + 3] in ("'''", '"""') else ch
            raw = i > 0 and source[i - 1] in "rR"
            j = i + len(quote)
            while j < n and not source.startswith(quote, j):
                j += 2 if source[j] == "\\" and not raw else 1
            i = j + len(quote)
            continue
        if ch.isdigit():  # a number literal (1e3, 0x1F, 2u): not an identifier
            m = re.match(r"[0-9A-Za-z_.]*", source[i:])
            i += max(1, len(m.group(0)) if m else 1)
            continue
        m = _IDENT.match(source, i)
        if m is None:
            i += 1
            continue
        start, end, name = m.start(), m.end(), m.group(0)
        before = source[:start].rstrip()
        after = source[end:].lstrip()
        is_prefix = name in ("r", "R", "b", "B", "rb", "br", "RB", "BR") and after[:1] in ("'", '"') and \
            source[end : end + 1] in ("'", '"')
        if not is_prefix and not before.endswith(".") and not after.startswith("("):
            out.append((start, end, name))
        i = end
    return out


def names_used(source: str, lets: Mapping[str, str]) -> list[str]:
    """The names of `lets` that `source` refers to, in order of first use."""
    return list(dict.fromkeys(name for _, _, name in _identifiers(source) if name in lets))


def expand(source: str, lets: Mapping[str, str]) -> str:
    """`source` with every name of `lets` replaced by its (already expanded) expression in parentheses."""
    if not lets:
        return source
    pieces: list[str] = []
    last = 0
    for start, end, name in _identifiers(source):
        if name in lets:
            pieces.append(source[last:start])
            pieces.append(f"({lets[name]})")
            last = end
    if not pieces:
        return source
    pieces.append(source[last:])
    out = "".join(pieces)
    if len(out) > MAX_EXPANDED:
        raise ConditionError(f"with its names replaced it grows to {len(out):,} characters (more than "
                             f"{MAX_EXPANDED:,}): a name used several times inside other names multiplies; "
                             "use each name fewer times", 0, 0)
    return out


def _position(source: str, offset: int) -> tuple[int, int]:
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def check_name(name: str) -> str | None:
    """Why `name` cannot be a `let` name, or None."""
    if not LET_NAME.match(name):
        return f"let name '{name}' is not an identifier (letters, digits and _, not starting with a digit)"
    if name in VARIABLES:
        return f"let name '{name}' is a condition variable already"
    if name in RESERVED:
        return f"let name '{name}' is a CEL keyword or type"
    if name in known_functions():
        return f"let name '{name}' is a function"
    return None


def check_lets(lets: Mapping[str, str]) -> dict[str, str]:
    """Check every named expression and return them expanded (no names left inside).

    Raises `ConditionError` (with a `name` attribute: the let it concerns, and a position
    inside its expression) for a bad name, an expression that does not compile, a name
    used as a macro's variable, or a cycle.
    """
    names = tuple(lets)
    for name, source in lets.items():
        problem = check_name(name)
        if problem is not None:
            raise _located(ConditionError(problem, 0, 0), name)
        if not isinstance(source, str):
            raise _located(ConditionError(f"let '{name}': write a CEL expression in quotes", 0, 0), name)
        try:
            compile_expression(source, (*VARIABLES, *names), what=f"let '{name}'")
        except ConditionError as exc:
            raise _located(exc, name) from None
        for bound in _MACRO_VAR.finditer(source):
            if bound.group(1) in lets:
                raise _located(ConditionError(
                    f"let '{name}': '{bound.group(1)}' is a let name; use another name for the macro's variable",
                    *_position(source, bound.start(1))), name)
    expanded: dict[str, str] = {}

    def resolve(name: str, stack: tuple[str, ...]) -> str:
        if name in expanded:
            return expanded[name]
        if name in stack:
            cycle = " -> ".join((*stack[stack.index(name):], name))
            source = lets[stack[-1]]
            at = next((s for s, _, n in _identifiers(source) if n == name), 0)
            raise _located(ConditionError(f"let '{stack[-1]}': names refer to each other in a cycle ({cycle})",
                                          *_position(source, at)), stack[-1])
        inner = {n: resolve(n, (*stack, name)) for n in names_used(lets[name], lets)}
        try:
            expanded[name] = expand(lets[name], inner)
        except ConditionError as exc:
            raise _located(ConditionError(f"let '{name}': {exc.message}", 0, 0), name) from None
        return expanded[name]

    for name in names:
        resolve(name, ())
    return expanded


def _located(exc: ConditionError, name: str) -> ConditionError:
    exc.let_name = name  # type: ignore[attr-defined]
    return exc
