"""The CEL functions proctor adds to conditions, registered in one place.

The Rust core of the `cel` package implements CEL's standard library (`size`,
`contains`, `matches`, the macros…); everything else a condition may call is a Python
function registered here, as a `CelFunction` in `FUNCTIONS`:

- `normalize(s)`: the string as a person reads it — NFKC, case-folded, invisible
  characters removed, whitespace collapsed and trimmed. Compare *normalised* strings:
  ``args.to.endsWith('@competitor.com')`` is passed by ``@Competitor.COM``.
- `email_domain(s)`: the normalised domain of one e-mail address (``Bob <b@X.com.>``
  gives ``x.com``); ``''`` without an ``@``; an error for several addresses.
- `links(s)`: the links a reader could follow in a text, one by one (`proctor.links`), so a rule can ask
  where each came from (``links(args.body).all(u, from_user(u))``);
- the cel-go strings extension: `lowerAscii`, `upperAscii`, `split`, `join`,
  `replace`, `indexOf`, `lastIndexOf`, `substring`, `trim`, `charAt`;
- paths: `path_normalize(p)` — `p` with ``.``, ``..``, repeated and trailing separators resolved
  lexically (POSIX) — and `path_within(p, root)` — whether `p`, so normalised, is `root` or
  below it (`root` may be a list: any of them). Lexical only: symlinks are the tool's business
  (docs/policy.md, "Paths");
- aggregates over lists: `sum`, `min`, `max` (``sum(history.map(h, …))``), and `last(list, n)`,
  the last `n` items (``history.last(100)``: a window the policy writes, see
  `proctor.policy.aggregates`);
- data flow: `provenance(value)` — the labels of the sources (results of labelled tools, the
  task as ``user``) `value`, an item of it or a token inside it appeared in, sorted — and
  `from_user(value)`, true when the value as a whole came from the task, and `text_provenance(value)`,
  the labels of the sources where it appeared only inside longer text (`proctor.provenance`).

Method and call syntax are the same in CEL (``s.lowerAscii()`` is ``lowerAscii(s)``).
A function that needs the call being decided (its run, history…) is registered with
`bind` instead of `fn`: ``bind(call)`` returns the callable for that one decision.
A condition's `Condition.functions` lists the registered functions it calls, and only
those are added to a decision's CEL context (adding one costs about a microsecond).
Any exception raised here fails the condition, which denies the call.
"""

from __future__ import annotations

import inspect
import logging
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proctor.calls import Call
from proctor.links import links_in
from proctor.policy._cel import cel
from proctor.provenance import ProvenanceIndex
from proctor.unicodenorm import nfkc

__all__ = [
    "BOX_PREFIX",
    "FUNCTIONS",
    "NATIVE_FUNCTIONS",
    "CelFunction",
    "PROVENANCE_FUNCTIONS",
    "RECORD_FUNCTIONS",
    "boxed",
    "cel_sum",
    "email_domain",
    "known_functions",
    "normalize",
    "path_normalize",
    "path_within",
    "register",
]

_INT64 = (-(2**63), 2**63 - 1)


class _QuietFunctionFailures(logging.Filter):
    """The `cel` package logs a warning each time a Python function raises; proctor reports that
    error itself (the condition fails and the call is denied naming it), so the warning is noise
    on a console (`policy test` printed one per failing case)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Python function '")


logging.getLogger("cel").addFilter(_QuietFunctionFailures())


@dataclass(frozen=True, slots=True)
class CelFunction:
    """A function conditions may call: `fn` for all decisions, or `bind(call)` giving one per decision."""

    name: str
    fn: Callable[..., Any] | None = None
    bind: Callable[[Call | None], Callable[..., Any]] | None = None
    doc: str = ""
    #: For a function returning a list of strings: a ``bind`` whose callable returns the same value as
    #: a `cel.OptionalValue` (built once per distinct value). Conditions then call the hidden companion
    #: ``__box_<name>(…).value()`` instead (`proctor.policy.conditions`): the `cel` package converts a
    #: returned Python list item by item (~3 µs per string: it tries nine other types first), while an
    #: OptionalValue it already holds costs nothing to pass back.
    box: Callable[[Call | None], Callable[..., Any]] | None = None
    #: How many arguments it takes (fewest, most; None: no most), a method's receiver counted; checked
    #: when a condition is compiled. None: read from `fn`'s signature (a `bind` function gives it here).
    takes: tuple[int, int | None] | None = None

    def arity(self) -> tuple[int, int | None] | None:
        """(fewest, most) arguments a call may give it (None: not known, not checked)."""
        if self.takes is not None:
            return self.takes
        if self.fn is None:
            return None
        return _signature_arity(self.fn)

    def callable_for(self, call: Call | None) -> Callable[..., Any]:
        """The Python callable CEL runs for this function while deciding `call`."""
        if self.fn is not None:
            return self.fn
        assert self.bind is not None
        return self.bind(call)


def _signature_arity(fn: Callable[..., Any]) -> tuple[int, int | None] | None:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: not checked
        return None
    least, most = 0, 0
    for parameter in parameters:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return least, None
        if parameter.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            most += 1
            if parameter.default is inspect.Parameter.empty:
                least += 1
    return least, most


#: Every Python-implemented CEL function, by name.
FUNCTIONS: dict[str, CelFunction] = {}


def register(function: CelFunction) -> CelFunction:
    """Make `function` callable from every condition compiled after this (names are checked at load time)."""
    if (function.fn is None) == (function.bind is None):
        raise ValueError(f"CEL function {function.name!r}: give exactly one of fn and bind")
    if not re.fullmatch(r"[A-Za-z_][\w.]*", function.name):
        raise ValueError(f"CEL function name {function.name!r} is not an identifier")
    FUNCTIONS[function.name] = function
    if function.box is not None:
        FUNCTIONS[BOX_PREFIX + function.name] = CelFunction(BOX_PREFIX + function.name, bind=function.box,
                                                           doc=f"{function.name}() as a cel.OptionalValue")
    return function


#: Functions of the native CEL library (operators are named `_x_`, `!_`, `@in`… and always allowed).
NATIVE_FUNCTIONS: frozenset[str] = frozenset(
    {
        "size", "contains", "startsWith", "endsWith", "matches",
        "int", "uint", "double", "string", "bytes", "timestamp", "duration", "dyn", "type",
        "getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear",
        "getHours", "getMinutes", "getSeconds", "getMilliseconds",
        "of", "none", "hasValue", "value", "orValue", "or",
    }
)  # fmt: skip


def known_functions() -> frozenset[str]:
    """Every function a condition may call: CEL's native ones and proctor's registry (`FUNCTIONS`)."""
    return NATIVE_FUNCTIONS | frozenset(FUNCTIONS)


#: Prefix of the hidden companion of a function registered with `box` (see `CelFunction.box`).
BOX_PREFIX = "__box_"


def boxed(values: tuple[str, ...]) -> Any:
    """`values` as a `cel.OptionalValue` holding a list, built once per distinct tuple."""
    box = _BOXES.get(values)
    if box is None:
        if len(_BOXES) > 4096:  # label sets are few; a bound keeps a pathological run from growing it
            _BOXES.clear()
        box = _BOXES[values] = cel.OptionalValue.of(list(values))
    return box


_BOXES: dict[tuple[str, ...], Any] = {}


def _type_name(value: Any) -> str:
    return {bool: "bool", int: "int", float: "double", str: "string", bytes: "bytes", list: "list",
            dict: "map", type(None): "null"}.get(type(value), type(value).__name__)  # fmt: skip


def _string(fn: str, value: Any, what: str = "a string") -> str:
    if not isinstance(value, str):
        raise TypeError(f"{fn}() takes {what}, got {_type_name(value)}")
    return value


def _int(fn: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{fn}() takes an int here, got {_type_name(value)}")
    return value


# -- normalisation -----------------------------------------------------------------------------

# Characters a reader does not see: format (Cf: zero-width space/joiners, BOM, bidi
# controls, soft hyphen…), controls other than whitespace, and a few fillers.
_INVISIBLE_EXTRA = frozenset("\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u3164\uffa0")
_SPACES = re.compile(r"\s+")


def _visible(text: str) -> str:
    out = []
    for ch in text:
        if ch.isspace():
            out.append(" ")
            continue
        category = unicodedata.category(ch)
        if category in ("Cf", "Cc", "Cs", "Co", "Cn") or ch in _INVISIBLE_EXTRA or "\ufe00" <= ch <= "\ufe0f":
            continue
        out.append(ch)
    return "".join(out)


def normalize(value: Any) -> str:
    """NFKC, case-folded, invisible characters removed, whitespace collapsed and trimmed."""
    text = _string("normalize", value)
    if text.isascii() and text.isprintable() and "  " not in text and text == text.strip():
        return text.lower()  # the common case, ~10x faster; same result for printable ASCII
    text = nfkc(_visible(text)).casefold()  # linear even on a flood of combining marks
    # Case folding and NFKC can each produce what the other changes: apply both until stable.
    text = nfkc(text).casefold()
    return _SPACES.sub(" ", text).strip()


_ANGLE = re.compile(r"<([^<>]*)>")
_SEPARATORS = re.compile(r"[,;\s]")


def email_domain(value: Any) -> str:
    """The normalised domain of one address: ``'Bob <b@X.COM.>'`` -> ``'x.com'``; ``''`` without an ``@``."""
    text = normalize(_string("email_domain", value))
    angled = _ANGLE.findall(text)
    if len(angled) > 1:
        raise ValueError("email_domain() takes one address, got several")
    address = angled[0] if angled else text
    address = address.strip(" '<>()[]")
    if "@" not in address:
        if "@" in text:  # an '@' outside the <…> part: ambiguous
            raise ValueError("email_domain() takes one address, got an '@' outside <…>")
        return ""
    local, _, domain = address.rpartition("@")
    domain = domain.strip().rstrip(".").strip()
    quoted = local.startswith('"')
    if _SEPARATORS.search(domain) or (not quoted and (_SEPARATORS.search(local) or "@" in local)):
        raise ValueError("email_domain() takes one address, got several (or spaces inside it)")
    return domain


# Full stops IDNA reads as a host's dots and NFKC leaves alone.
_IDNA_DOTS = str.maketrans({"\u3002": ".", "\uff61": "."})


def links(value: Any) -> list[str]:
    """The links of a text (`proctor.links`), read after NFKC with invisible characters removed, so that a
    link spelled in full-width letters or split by a zero-width space is still one."""
    text = _string("links", value)
    if not text.isascii():
        text = nfkc(_visible(text)).translate(_IDNA_DOTS)
    return links_in(text)


# -- paths -------------------------------------------------------------------------------------


def _path(fn: str, value: Any, what: str = "path") -> str:
    if not isinstance(value, str):
        raise TypeError(f"{fn}() takes a {what} as a string, got {_type_name(value)}")
    if not value:
        raise ValueError(f"{fn}(): the {what} is empty")
    if "\x00" in value:
        raise ValueError(f"{fn}(): the {what} holds a NUL byte (no file system accepts one)")
    return value


def path_normalize(value: Any) -> str:
    """`value` as a POSIX path with ``.``, ``..``, repeated and trailing separators resolved, lexically.

    As `os.path.normpath` on POSIX, except that a leading ``//`` is ``/`` (Linux reads it so):
    ``/srv/out/../private`` -> ``/srv/private``, ``//srv//out/./x/`` -> ``/srv/out/x``,
    ``/..`` -> ``/``, ``a/../../b`` -> ``../b``. Nothing is decoded (``%2e%2e`` is a name) and
    the file system is not read (a symlink is followed by the tool, not here). An empty path,
    a NUL byte or a non-string is an error (the condition then denies).
    """
    text = _path("path_normalize", value)
    absolute = text.startswith("/")
    parts: list[str] = []
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not absolute:
                parts.append(part)  # above a relative path's start: kept, so it is never inside a root
            continue  # ("/.." is "/")
        parts.append(part)
    joined = "/".join(parts)
    if absolute:
        return "/" + joined
    return joined or "."


def path_within(value: Any, root: Any) -> bool:
    """Whether the normalised `value` is the normalised `root` or a path below it (`root`: a string or a list).

    ``path_within('/srv/out/../private', '/srv/out')`` is false, ``'/srv/outside'`` is not below
    ``'/srv/out'``; a relative path is never within an absolute root (nor the reverse): what
    it is relative to is the tool's working directory, which the policy does not see.
    """
    path = path_normalize(_path("path_within", value))
    roots = root if isinstance(root, (list, tuple)) else [root]
    if not roots:
        raise ValueError("path_within(): the list of roots is empty")
    for item in roots:
        base = path_normalize(_path("path_within", item, "root"))
        if base == ".":  # the working directory: any relative path that does not climb above it
            if not path.startswith("/") and path != ".." and not path.startswith("../"):
                return True
        elif path == base or path.startswith(base if base.endswith("/") else base + "/"):
            return True
    return False


def _last(values: Any, count: Any) -> list[Any]:
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"last() takes a list, got {_type_name(values)}")
    n = _int("last", count)
    if n < 0:
        raise ValueError(f"last(): the count is negative ({n})")
    return list(values[max(len(values) - n, 0) :])


# -- aggregates --------------------------------------------------------------------------------


def _numbers(fn: str, values: Any) -> list[int | float]:
    if not isinstance(values, (list, tuple)):
        raise TypeError(f"{fn}() takes a list of numbers, got {_type_name(values)}")
    for item in values:
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise TypeError(f"{fn}() takes a list of numbers, got a {_type_name(item)} in it")
    return list(values)


def cel_sum(values: Any, start: Any = 0) -> int | float:
    """`sum(list)` / `sum(list, start)`: `start` (0) plus every item; an int when all are ints, else a double.

    Ints are promoted when a double is present (amounts are written both ways); a
    bool, string or null in the list is an error, and so is an int sum outside int64.
    Give a double start (``sum(xs, 0.0)``) when the result meets a double in arithmetic:
    the sum of an empty list is then 0.0, not the int 0 (CEL does not add int and double).
    """
    items = _numbers("sum", values)
    first = _numbers("sum", [start])[0]
    if isinstance(first, float) or any(isinstance(item, float) for item in items):
        total = float(first)
        for item in items:  # in order, as an incremental fold adds them
            total += float(item)
        return total
    whole = first + sum(items)
    if not _INT64[0] <= whole <= _INT64[1]:
        raise OverflowError("sum() overflows int64")
    return whole


def _extreme(fn: str, pick: Callable[..., Any]) -> Callable[..., Any]:
    def compute(*args: Any) -> Any:
        items = _numbers(fn, args[0] if len(args) == 1 else list(args))
        if not items:
            raise ValueError(f"{fn}() of an empty list")
        return pick(items)

    compute.__name__ = fn
    return compute


# -- the strings extension (cel-go semantics) ------------------------------------------------------


def _lower_ascii(s: Any) -> str:
    return _string("lowerAscii", s).translate(_LOWER)


def _upper_ascii(s: Any) -> str:
    return _string("upperAscii", s).translate(_UPPER)


_LOWER = {c: c + 32 for c in range(ord("A"), ord("Z") + 1)}
_UPPER = {c + 32: c for c in range(ord("A"), ord("Z") + 1)}


def _split(s: Any, sep: Any, limit: Any = -1) -> list[str]:
    text, sep, limit = _string("split", s), _string("split", sep), _int("split", limit)
    if limit == 0:
        return []
    if sep == "":
        chars = list(text)
        return chars if limit < 0 or limit >= len(chars) else [*chars[: limit - 1], "".join(chars[limit - 1 :])]
    return text.split(sep) if limit < 0 else text.split(sep, limit - 1)


def _join(items: Any, sep: Any = "") -> str:
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise TypeError("join() takes a list of strings")
    return _string("join", sep).join(items)


def _replace(s: Any, old: Any, new: Any, limit: Any = -1) -> str:
    text, old, new = _string("replace", s), _string("replace", old), _string("replace", new)
    limit = _int("replace", limit)
    return text.replace(old, new) if limit < 0 else text.replace(old, new, limit)


def _offset(fn: str, text: str, offset: Any) -> int:
    at = _int(fn, offset)
    if not 0 <= at <= len(text):
        raise IndexError(f"{fn}(): offset {at} out of range for a string of length {len(text)}")
    return at


def _index_of(s: Any, sub: Any, offset: Any = 0) -> int:
    text, sub = _string("indexOf", s), _string("indexOf", sub)
    return text.find(sub, _offset("indexOf", text, offset))


def _last_index_of(s: Any, sub: Any, offset: Any = None) -> int:
    text, sub = _string("lastIndexOf", s), _string("lastIndexOf", sub)
    if offset is None:
        return text.rfind(sub)
    return text.rfind(sub, 0, _offset("lastIndexOf", text, offset) + len(sub))


def _substring(s: Any, start: Any, end: Any = None) -> str:
    text = _string("substring", s)
    start = _offset("substring", text, start)
    stop = len(text) if end is None else _offset("substring", text, end)
    if start > stop:
        raise IndexError(f"substring(): start {start} is after end {stop}")
    return text[start:stop]


def _trim(s: Any) -> str:
    return _string("trim", s).strip()


def _char_at(s: Any, index: Any) -> str:
    text = _string("charAt", s)
    index = _offset("charAt", text, index)
    return text[index : index + 1]


_BUILTIN: Mapping[str, tuple[Callable[..., Any], str]] = {
    "normalize": (normalize, "NFKC, case-folded, invisible characters removed, whitespace collapsed and trimmed"),
    "email_domain": (email_domain, "the normalised domain of one e-mail address ('' without '@')"),
    "links": (links, "the links of a text (URLs, www. hosts, bare host names), in order, each once"),
    "sum": (cel_sum, "sum(list[, start]) of numbers (start, 0, when empty; a double if any is one)"),
    "min": (_extreme("min", min), "smallest number of a list"),
    "last": (_last, "last(list, n): the last n items (all when fewer); history.last(n) is a window of the run"),
    "path_normalize": (path_normalize, "a POSIX path with '.', '..', repeated and trailing '/' resolved, lexically"),
    "path_within": (path_within, "path_within(path, root or [roots]): the normalised path is the root or below it"),
    "max": (_extreme("max", max), "largest number of a list"),
    "lowerAscii": (_lower_ascii, "ASCII letters lower-cased"),
    "upperAscii": (_upper_ascii, "ASCII letters upper-cased"),
    "split": (_split, "split(sep[, limit]) -> list of strings"),
    "join": (_join, "list.join([sep]) -> string"),
    "replace": (_replace, "replace(old, new[, limit])"),
    "indexOf": (_index_of, "first index of a substring (-1 if absent)"),
    "lastIndexOf": (_last_index_of, "last index of a substring (-1 if absent)"),
    "substring": (_substring, "substring(start[, end])"),
    "trim": (_trim, "leading and trailing whitespace removed"),
    "charAt": (_char_at, "the character at an index ('' at the end)"),
}
for _name, (_fn, _doc) in _BUILTIN.items():
    register(CelFunction(_name, fn=_fn, doc=_doc))


# -- data flow (proctor.provenance) ----------------------------------------------------------------

#: The functions that read the run's provenance index: a policy calling one makes the gate keep it.
PROVENANCE_FUNCTIONS = frozenset({"provenance", "from_user", "text_provenance",
                                  "__box_provenance", "__box_text_provenance",
                                  "field_provenance", "field_paths", "carries", "same_record", "same_call",
                                  "same_source"})  # (proctor.policy.dataflow)
#: The functions that read a run's records (`same_record`, `same_call`): only a policy calling one has the index
#: keep them (they cost time per value of a result of a tool with sources).
RECORD_FUNCTIONS = frozenset({"same_record", "same_call"})


def _no_sources(value: Any) -> list[str]:
    return []


def _no_sources_boxed(value: Any) -> Any:
    return boxed(())


def _not_from_user(value: Any) -> bool:
    return False


def _bind_provenance(call: Call | None) -> Callable[..., Any]:
    index = call.provenance if call is not None else None
    return _no_sources if index is None else index.labels_of


def _box_provenance(call: Call | None) -> Callable[..., Any]:
    index = call.provenance if call is not None else None
    if index is None:
        return _no_sources_boxed
    sources = index.sources_of
    return lambda value: boxed(sources(value))


def _bind_text_provenance(call: Call | None) -> Callable[..., Any]:
    index = call.provenance if call is not None else None
    return _no_sources if index is None else index.text_labels


def _box_text_provenance(call: Call | None) -> Callable[..., Any]:
    index = call.provenance if call is not None else None
    if index is None:
        return _no_sources_boxed
    sources = index.text_sources_of
    return lambda value: boxed(sources(value))


def _bind_from_user(call: Call | None) -> Callable[..., Any]:
    index = call.provenance if call is not None else None
    return _not_from_user if index is None else index.from_user


register(CelFunction("provenance", bind=_bind_provenance, box=_box_provenance, takes=(1, 1),
                     doc="labels of the sources a value (or any item or token of it) appeared in, sorted"))
register(CelFunction("text_provenance", bind=_bind_text_provenance, box=_box_text_provenance, takes=(1, 1),
                     doc="labels of the sources in which a value appeared only inside longer text, never whole"))
register(CelFunction("from_user", bind=_bind_from_user, takes=(1, 1),
                     doc="true when the value as a whole (every item of a list or map) came from the task"))


# -- data flow at the level of fields (proctor.policy.dataflow) ---------------------------------------------


def _provenance_index(call: Call | None) -> ProvenanceIndex | None:
    index = call.provenance if call is not None else None
    return index if isinstance(index, ProvenanceIndex) else None


def _no_labels(value: Any) -> list[str]:
    return []


def _carries_nothing(value: Any, labels: Any) -> bool:
    _labels_argument(labels)
    return False


def _labels_argument(labels: Any) -> tuple[str, ...]:
    if isinstance(labels, str):
        return (labels,)
    if isinstance(labels, (list, tuple)) and all(isinstance(label, str) for label in labels):
        return tuple(labels)
    raise TypeError("carries() takes a value and a label or a list of labels")


def _bind(method: Callable[[ProvenanceIndex], Callable[..., Any]], empty: Callable[..., Any]) -> Callable[
        [Any], Callable[..., Any]]:
    def bind(call: Call | None) -> Callable[..., Any]:
        index = _provenance_index(call)
        return empty if index is None else method(index)

    return bind


def _bound_carries(index: ProvenanceIndex) -> Callable[..., Any]:
    return lambda value, labels: index.carries(value, _labels_argument(labels))


def _tools_argument(tools: Any) -> tuple[str, ...]:
    if isinstance(tools, str):
        return (tools,)
    if isinstance(tools, (list, tuple)) and all(isinstance(name, str) for name in tools):
        return tuple(tools)
    raise TypeError("same_record() and same_call() take two values and, third, a tool's name or a list of names")


def _bound_same(method: Callable[[ProvenanceIndex], Callable[..., bool]]) -> Callable[[ProvenanceIndex],
                                                                                     Callable[..., Any]]:
    def bound(index: ProvenanceIndex) -> Callable[..., Any]:
        same = method(index)

        def call(a: Any, b: Any, tools: Any = None) -> bool:
            return same(a, b, None if tools is None else _tools_argument(tools))

        return call

    return bound


def _same_nothing(a: Any, b: Any, tools: Any = None) -> bool:
    if tools is not None:
        _tools_argument(tools)
    return False


register(CelFunction("same_record", bind=_bind(_bound_same(lambda i: i.same_record), _same_nothing), takes=(2, 3),
                     doc="same_record(a, b[, tools]): one record (the innermost map holding them) of a result of a "
                         "tool with sources held both as whole values"))
register(CelFunction("same_call", bind=_bind(_bound_same(lambda i: i.same_call), _same_nothing), takes=(2, 3),
                     doc="same_call(a, b[, tools]): one call's result (of a tool with sources) held both as whole "
                         "values"))
register(CelFunction("same_source", bind=_bind(lambda i: i.same_source, lambda a, b: False), takes=(2, 2),
                     doc="same_source(a, b): both appeared as whole values at one TOOL:PATH (the same field of the "
                         "same tool)"))
register(CelFunction("field_provenance", bind=_bind(lambda i: i.field_labels, _no_labels), takes=(1, 1),
                     doc="labels under which a value appeared as a whole value of a result (a field, an item), "
                         "never inside longer text; for a list, those every item has"))
register(CelFunction("field_paths", bind=_bind(lambda i: i.field_paths, _no_labels), takes=(1, 1),
                     doc="where a value appeared as a whole value of a result: 'TOOL:PATH' strings, sorted"))
register(CelFunction("carries", bind=_bind(_bound_carries, _carries_nothing), takes=(2, 2),
                     doc="carries(value, label or list): the value holds something from a source with that label, "
                         "matched as provenance() matches"))
