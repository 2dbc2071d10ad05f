"""`let:` — named CEL expressions defined once at the top of a policy, usable in every `when`.

```yaml
let:
  outbound: "tool in ['send_email', 'send_money', 'post_webpage']"
  vouched(v): "from_user(v) || 'trusted' in field_provenance(v)"
rules:
  - name: injected
    match: {side_effect: [external, destructive]}
    when: "outbound && !vouched(args.recipient)"
    decision: require_approval
```

A name is an identifier that is neither a condition variable, a function, nor a CEL
keyword; an expression may use the variables, the functions, and other names (a cycle is
a load error). A name followed by parameters in brackets (``vouched(v)``, ``pays(to, amount)``)
is a *condition with parameters*: it is used as a call (``vouched(args.to)``) with exactly as
many arguments, and inside its expression each parameter stands for the argument given.

Each use is replaced by the named expression in parentheses before the condition is compiled
(a parameter by its argument, in parentheses), so a name means exactly what its expression
means where it is used (history aggregates stay incremental, a failing name fails the
condition using it). Mistakes are load errors located in the file: a name used with the wrong
number of arguments, an unknown name inside an expression, a name that refers to itself
(directly or through others), and an argument that uses the variable of a macro of the
expression it is given to (``vouched(l)`` where `vouched` says ``….all(l, …)``: the argument
would be captured).
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from proctor.policy._cel import cel
from proctor.policy.conditions import VARIABLES, ConditionError, compile_expression
from proctor.policy.functions import known_functions

__all__ = [
    "LET_NAME",
    "MAX_EXPANDED",
    "RESERVED",
    "LetUse",
    "Signature",
    "check_lets",
    "check_source",
    "expand",
    "names_used",
    "signature",
    "uses",
]

#: Longest text a condition may grow to once its names are replaced: names used several times inside
#: other names multiply (20 lines of `a: "b + b"` would be a million copies), so past this it is an error.
MAX_EXPANDED = 100_000

LET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A `let:` key with parameters: ``vouched(v)``, ``pays(to, amount)``.
_WITH_PARAMS = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(\s*(.*?)\s*\)\s*$", re.DOTALL)
#: CEL's reserved words and literals, which no name may take.
RESERVED = frozenset({
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for", "function", "if",
    "import", "let", "loop", "package", "namespace", "return", "var", "void", "while",
    "int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type", "dyn",
    "has",  # the one global macro: `has(args.x)` must keep meaning it
})  # fmt: skip
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MACRO_VAR = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")
_TYPE_NAMES = frozenset({"int", "uint", "double", "string", "bool", "bytes", "list", "map", "null_type", "type"})


@dataclass(frozen=True, slots=True)
class Signature:
    """A `let:` key read: its name, and its parameters (None: a plain name, used without brackets)."""

    name: str
    params: tuple[str, ...] | None

    def __str__(self) -> str:
        return self.name if self.params is None else f"{self.name}({', '.join(self.params)})"


@functools.lru_cache(maxsize=4096)
def signature(key: str) -> Signature:
    """The name and parameters a `let:` key declares (``vouched(v)`` -> vouched, (v,)). Unchecked."""
    found = _WITH_PARAMS.match(key)
    if found is None:
        return Signature(key, None)
    inner = found.group(2)
    return Signature(found.group(1), tuple(p.strip() for p in inner.split(",")) if inner else ())


def _skip_string(source: str, i: int) -> int:
    """The offset just after the string literal starting at `i`."""
    n = len(source)
    quote = source[i : i + 3] if source[i : i + 3] in ("'''", '"""') else source[i]
    raw = i > 0 and source[i - 1] in "rR"
    j = i + len(quote)
    while j < n and not source.startswith(quote, j):
        j += 2 if source[j] == "\\" and not raw else 1
    return j + len(quote)


def _scan(source: str) -> list[tuple[int, int, str, bool]]:
    """(start, end, name, called) of each identifier of `source` outside string literals and not a field
    (after `.`); `called`: followed by `(` (a function, or a let with parameters)."""
    out: list[tuple[int, int, str, bool]] = []
    i, n = 0, len(source)
    while i < n:
        ch = source[i]
        if ch in "'\"":
            i = _skip_string(source, i)
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
        if not is_prefix and not before.endswith("."):
            out.append((start, end, name, after.startswith("(")))
        i = end
    return out


def _identifiers(source: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of each identifier of `source` that names something: outside string literals,
    not a field (after `.`), not a function (before `(`)."""
    return [(s, e, name) for s, e, name, called in _scan(source) if not called]


def _call_arguments(source: str, open_at: int) -> tuple[list[tuple[int, int]], int] | None:
    """The (start, end) of each argument of the call whose `(` is at `open_at`, and the offset after its `)`;
    None when the brackets do not close."""
    depth, i, n = 0, open_at, len(source)
    args: list[tuple[int, int]] = []
    start = open_at + 1
    while i < n:
        ch = source[i]
        if ch in "'\"":
            i = _skip_string(source, i)
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                if source[start:i].strip() or args:
                    args.append((start, i))
                return args, i + 1
        elif ch == "," and depth == 1:
            args.append((start, i))
            start = i + 1
        i += 1
    return None


def _position(source: str, offset: int) -> tuple[int, int]:
    line = source.count("\n", 0, offset) + 1
    return line, offset - (source.rfind("\n", 0, offset) + 1) + 1


def _table(lets: Mapping[str, str | None]) -> dict[str, tuple[Signature, str | None]]:
    """name -> (signature, expression) of each `let:` entry."""
    out: dict[str, tuple[Signature, str | None]] = {}
    for key, value in lets.items():
        sig = signature(key)
        out[sig.name] = (sig, value)
    return out


def names_used(source: str, lets: Mapping[str, str]) -> list[str]:
    """The names of `lets` (their keys, parameters included) that `source` refers to, in order of first use."""
    table = _table(lets)
    keys = {signature(k).name: k for k in lets}
    found = []
    for _, _, name, called in _scan(source):
        entry = table.get(name)
        if entry is not None and (entry[0].params is not None) == called:
            found.append(keys[name])
    return list(dict.fromkeys(found))


def expand(source: str, lets: Mapping[str, str]) -> str:
    """`source` with every name of `lets` replaced by its (already expanded) expression in parentheses, and
    every call of a name with parameters by its expression with each parameter replaced by the argument."""
    if not lets:
        return source
    out = _expand(source, _table(lets), 0)
    if len(out) > MAX_EXPANDED:
        raise ConditionError(f"with its names replaced it grows to {len(out):,} characters (more than "
                             f"{MAX_EXPANDED:,}): a name used several times inside other names multiplies; "
                             "use each name fewer times", 0, 0)
    return out


def _expand(source: str, table: Mapping[str, tuple[Signature, str | None]], depth: int) -> str:
    if depth > 64:  # arguments nested in arguments: check_lets refuses cycles, so only absurd nesting gets here
        raise ConditionError("names are nested more than 64 deep inside each other's arguments", 0, 0)
    pieces: list[str] = []
    last = 0
    scanned = _scan(source)
    skip_until = 0
    for start, end, name, called in scanned:
        if start < skip_until:  # inside the arguments of a call already replaced (expanded with it)
            continue
        entry = table.get(name)
        if entry is None or entry[1] is None:
            continue
        sig, body = entry[0], entry[1]
        if sig.params is None:
            if called:
                raise ConditionError(f"'{name}' is a let name without parameters: use it as {name}, not {name}(…)",
                                     *_position(source, start))
            pieces.append(source[last:start])
            pieces.append(f"({body})")
            last = end
            continue
        if not called:
            raise ConditionError(f"'{sig}' takes {_arguments(len(sig.params))}: use it as {sig}",
                                 *_position(source, start))
        open_at = source.index("(", end)
        parsed = _call_arguments(source, open_at)
        if parsed is None:
            raise ConditionError(f"'{name}(' is not closed", *_position(source, start))
        spans, after = parsed
        if len(spans) != len(sig.params):
            raise ConditionError(f"'{sig}' takes {_arguments(len(sig.params))}, given {len(spans)}",
                                 *_position(source, start))
        arguments = [_expand(source[a:b].strip(), table, depth + 1) for a, b in spans]
        captured = set(_MACRO_VAR.findall(body)).intersection(n for a in arguments for _, _, n in _identifiers(a))
        if captured:
            var = sorted(captured)[0]
            raise ConditionError(f"an argument of '{name}' uses '{var}', the variable of a macro inside "
                                 f"'{sig}': the argument would be captured; rename the macro's variable",
                                 *_position(source, start))
        pieces.append(source[last:start])
        pieces.append(f"({_substitute(body, dict(zip(sig.params, arguments, strict=True)))})")
        last = skip_until = after
    if not pieces:
        return source
    pieces.append(source[last:])
    return "".join(pieces)


def _substitute(body: str, values: Mapping[str, str]) -> str:
    """`body` with each parameter (an identifier naming something) replaced by its argument in parentheses."""
    pieces: list[str] = []
    last = 0
    for start, end, name in _identifiers(body):
        if name in values:
            pieces.append(body[last:start])
            pieces.append(f"({values[name]})")
            last = end
    pieces.append(body[last:])
    return "".join(pieces)


def _arguments(count: int) -> str:
    return "no argument" if count == 0 else "1 argument" if count == 1 else f"{count} arguments"


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


def _check_key(key: str, taken: set[str]) -> Signature:
    sig = signature(key)
    problem = check_name(sig.name)
    if problem is None and sig.name in taken:
        problem = f"let name '{sig.name}' is defined twice"
    if problem is None and sig.params is not None:
        seen: set[str] = set()
        for param in sig.params:
            if not LET_NAME.match(param):
                problem = (f"let '{key}': parameter '{param}' is not an identifier (write the parameters as "
                           f"{sig.name}(a, b))")
            elif param in VARIABLES or param in RESERVED:
                problem = f"let '{key}': parameter '{param}' is a condition variable or a CEL keyword"
            elif param in seen:
                problem = f"let '{key}': parameter '{param}' is given twice"
            if problem:
                break
            seen.add(param)
    if problem is not None:
        raise ConditionError(problem, 0, 0)
    return sig


def check_source(source: str, variables: tuple[str, ...], lets: Mapping[str, str | None], what: str,
                 extra: tuple[str, ...] = ()) -> None:
    """Check that `source` compiles and uses only `variables`, `extra` names, the functions, and the names of
    `lets` as they are declared (a name with parameters called, with as many arguments; one without, not
    called); raise `ConditionError` located inside `source`."""
    table = _table(lets)
    plain = tuple(n for n, (s, _) in table.items() if s.params is None)
    with_params = {n: s for n, (s, _) in table.items() if s.params is not None}
    scanned = _scan(source)
    try:
        program = cel.compile(source)
    except ValueError:
        compile_expression(source, (*variables, *extra, *plain), what=what)  # raises the located syntax error
        raise
    for start, end, name, called in scanned:
        sig = with_params.get(name)
        if sig is not None and sig.params is not None:
            if not called:
                raise ConditionError(f"{what}: '{sig}' takes {_arguments(len(sig.params))}: use it as {sig}",
                                     *_position(source, start))
            parsed = _call_arguments(source, source.index("(", end))
            given = -1 if parsed is None else len(parsed[0])
            if given != len(sig.params):
                raise ConditionError(f"{what}: '{sig}' takes {_arguments(len(sig.params))}, given {given}",
                                     *_position(source, start))
        elif name in plain and called:
            raise ConditionError(f"{what}: '{name}' is a let name without parameters: use it as {name}, not "
                                 f"{name}(…)", *_position(source, start))
    masked = list(source)
    for start, end, name, called in scanned:
        if called and name in with_params:
            open_at = source.index("(", end)
            parsed = _call_arguments(source, open_at)
            if parsed is not None:  # `vouched(a, b)` read as `       [a, b]`: the same arguments at the same places
                masked[start:end] = " " * (end - start)
                masked[open_at], masked[parsed[1] - 1] = "[", "]"
    # The names without parameters are variables here, and compile_expression checks everything else (syntax,
    # unknown names, every function's arity), located in `source` as written.
    compile_expression("".join(masked), tuple(dict.fromkeys((*variables, *extra, *plain))), what=what)
    bound = set(_MACRO_VAR.findall(source))
    allowed = (*variables, *extra, *plain)
    for name in program.variables():
        if name in allowed or (name in bound and name not in VARIABLES) or name in _TYPE_NAMES:
            continue
        close = difflib.get_close_matches(name, sorted(allowed), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        at = re.search(rf"(?<![\w.]){re.escape(name)}\b", source)
        raise ConditionError(f"{what}: unknown variable '{name}' ({hint}variables: {', '.join(allowed)})",
                             *_position(source, at.start() if at else 0))
    known = known_functions()
    for fn in program.functions():
        if fn[:1] in "_!-@" or fn in known or fn in with_params:
            continue
        close = difflib.get_close_matches(fn, sorted(known | set(with_params)), n=1)
        at = re.search(rf"\b{re.escape(fn)}\s*\(", source)
        raise ConditionError(f"{what}: unknown function '{fn}'{f' (did you mean {close[0]!r}?)' if close else ''}",
                             *_position(source, at.start() if at else 0))
    for found in _MACRO_VAR.finditer(source):
        if found.group(1) in table:
            raise ConditionError(f"{what}: '{found.group(1)}' is a let name; use another name for the macro's "
                                 "variable", *_position(source, found.start(1)))


def check_lets(lets: Mapping[str, str]) -> dict[str, str]:
    """Check every named expression and return them expanded (no names left inside), by their keys as written.

    Raises `ConditionError` (with a `let_name` attribute: the key it concerns, and a position
    inside its expression) for a bad name or parameter, an expression that does not compile, an
    unknown name, a name used with the wrong number of arguments, a name used as a macro's
    variable, or a cycle.
    """
    taken: set[str] = set()
    signatures: dict[str, Signature] = {}
    for key in lets:
        try:
            sig = _check_key(str(key), taken)
        except ConditionError as exc:
            raise _located(exc, str(key)) from None
        taken.add(sig.name)
        signatures[key] = sig
    for key, source in lets.items():
        sig = signatures[key]
        if not isinstance(source, str):
            raise _located(ConditionError(f"let '{key}': write a CEL expression in quotes", 0, 0), key)
        params = sig.params or ()
        for found in _MACRO_VAR.finditer(source):
            if found.group(1) in params:
                raise _located(ConditionError(
                    f"let '{key}': parameter '{found.group(1)}' is also a macro's variable; use another name for "
                    "one of them", *_position(source, found.start(1))), key)
        try:
            check_source(source, VARIABLES, lets, f"let '{key}'", params)
        except ConditionError as exc:
            raise _located(exc, key) from None
    expanded: dict[str, str] = {}
    by_name = {sig.name: key for key, sig in signatures.items()}

    def resolve(key: str, stack: tuple[str, ...]) -> str:
        if key in expanded:
            return expanded[key]
        if key in stack:
            names = [signatures[k].name for k in (*stack[stack.index(key):], key)]
            source = lets[stack[-1]]
            at = next((s for s, _, n, _ in _scan(source) if n == signatures[key].name), 0)
            raise _located(ConditionError(f"let '{signatures[stack[-1]].name}': names refer to each other in a "
                                          f"cycle ({' -> '.join(names)})", *_position(source, at)), stack[-1])
        inner = {by_name[signatures[k].name]: resolve(k, (*stack, key)) for k in names_used(lets[key], lets)}
        try:
            expanded[key] = expand(lets[key], inner)
        except ConditionError as exc:
            raise _located(ConditionError(f"let '{key}': {exc.message}", exc.line, exc.column), key) from None
        if expanded[key] != lets[key]:  # names used inside: the whole, as CEL will run it (every function's arity)
            try:
                compile_expression(expanded[key], (*VARIABLES, *(signatures[key].params or ())),
                                   what=f"let '{key}'")
            except ConditionError as exc:
                raise _located(ConditionError(f"{exc.message} (with its names replaced)", 0, 0), key) from None
        shadowed = set(_MACRO_VAR.findall(expanded[key])).intersection(signatures[key].params or ())
        if shadowed:  # a name used inside binds the parameter's name in a macro: the argument would land there
            raise _located(ConditionError(
                f"let '{key}': parameter '{sorted(shadowed)[0]}' is the variable of a macro of a name it uses; "
                "rename the parameter", 0, 0), key)
        return expanded[key]

    for key in lets:
        resolve(key, ())
    return expanded


@dataclass(frozen=True, slots=True)
class LetUse:
    """One use of a `let:` name in a condition: as written (``vouched(args.to)``) and as CEL runs it."""

    written: str
    expanded: str


def uses(source: str, lets: Mapping[str, str]) -> list[LetUse]:
    """The uses of `lets`' names in `source` (each distinct one once, in order), for `policy explain`."""
    table = _table(lets)
    found: dict[str, LetUse] = {}
    for start, end, name, called in _scan(source):
        entry = table.get(name)
        if entry is None or entry[1] is None or (entry[0].params is not None) != called:
            continue
        stop = end
        if called:
            parsed = _call_arguments(source, source.index("(", end))
            if parsed is None:
                continue
            stop = parsed[1]
        written = source[start:stop]
        if written not in found:
            found[written] = LetUse(written, expand(written, lets))
    return list(found.values())


def _located(exc: ConditionError, name: str) -> ConditionError:
    exc.let_name = name  # type: ignore[attr-defined]
    return exc
