"""History aggregates kept incrementally, so a decision costs the same at call #10 and #10,000.

A condition such as ``history.exists(h, h.tool == 'read_secret')`` or
``size(history.filter(h, h.tool == 'send_email')) >= 5`` reads the whole run. Evaluated
as written, every decision converts and scans every earlier call: linear per call,
quadratic per run (and cubic with the `cel` package's ``map()``, which copies its
result list at every step: see docs/cel-upstream-map.md).

When a condition is compiled, every *entry-local pipeline* over `history` is found in
its source and replaced by a call to a hidden function:

    history[.filter(v, P) | .map(v, E) | .map(v, P, E)]* [.exists(v, P) | .all(v, P)
        | .exists_one(v, P) | .size() | .sum()]      also size(history…) and sum(history…)

where every ``P``/``E`` reads only its bound name, literals and pure functions (not
`args`, `tool`, `run`, `usage` or anything else of the current call). Such a pipeline
has the same value for an entry whatever call is being decided, so each run folds it
once per entry: a `Fold` remembers how far it has got and, at the next decision, feeds
it only the calls made since (`RunContext.aggregate`). The stages are CEL programs
evaluated on one entry at a time, so their meaning is CEL's; the folds combine the
per-entry results as CEL's macros do, errors included (``exists`` is true if any entry
holds even when another errs; otherwise an error is the result, and it reaches the
condition as an error of the hidden function, which ``||``/``&&`` absorb as they absorb
any CEL error).

A pipeline that is not entry-local (``history.exists(h, h.args.to == args.to)``) stays
as written and reads the run's retained window of entries (see `RunContext`). Pipelines
are interned process-wide by their token text, so a thousand rules with the same
``history.exists(…)`` share one fold per run.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import cel

from proctor.policy.functions import FUNCTIONS as CEL_FUNCTIONS

__all__ = [
    "PURE_FUNCTIONS", "AggregateError", "Fold", "Pipeline", "Rewrite", "fold_list", "is_hidden", "pipeline_named",
    "rewrite", "unbox_source",
]

#: CEL-native functions a stage may call and still be entry-local (they depend on their arguments
#: only; operators, named `_x_`, `!_`, `@in`…, are always pure). Functions of proctor's registry
#: (`proctor.policy.functions`) are pure when registered with `fn=`; one with `bind=` reads the call
#: being decided, so a stage calling it is evaluated as written.
PURE_FUNCTIONS: frozenset[str] = frozenset({
    "size", "contains", "startsWith", "endsWith", "matches", "has",
    "int", "uint", "double", "string", "bytes", "timestamp", "duration", "dyn", "type",
    "getFullYear", "getMonth", "getDate", "getDayOfMonth", "getDayOfWeek", "getDayOfYear",
    "getHours", "getMinutes", "getSeconds", "getMilliseconds",
    "all", "exists", "exists_one", "map", "filter",
})  # fmt: skip


def _pure(name: str) -> bool:
    if name in PURE_FUNCTIONS:
        return True
    registered = CEL_FUNCTIONS.get(name)
    return registered is not None and registered.fn is not None

_MACROS = frozenset({"all", "exists", "exists_one", "map", "filter"})
_TERMINALS = frozenset({"exists", "all", "exists_one", "size", "sum"})
_KEYWORDS = frozenset({"true", "false", "null", "in"})
_TYPE_NAMES = frozenset({"int", "uint", "double", "string", "bool", "bytes", "list", "map", "null_type", "type"})

_TOKEN = re.compile(
    r"""(?P<ws>\s+|//[^\n]*)
      | (?P<str>(?:[rR][bB]?|[bB][rR]?)?(?:'''(?:\\.|[^\\])*?'''|\"\"\"(?:\\.|[^\\])*?\"\"\"
                 |'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
      | (?P<num>0[xX][0-9a-fA-F]+[uU]?|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[uU]?)
      | (?P<id>[A-Za-z_]\w*)
      | (?P<op>&&|\|\||==|!=|<=|>=|[-+*/%!<>?:.,()\[\]{}])""",
    re.VERBOSE | re.DOTALL,
)


class _Tok:
    __slots__ = ("end", "kind", "start", "text")

    def __init__(self, kind: str, text: str, start: int, end: int) -> None:
        self.kind, self.text, self.start, self.end = kind, text, start, end


def _tokens(source: str) -> list[_Tok] | None:
    """CEL's tokens (no whitespace or comments), or None when the source is not plain CEL."""
    out: list[_Tok] = []
    pos = 0
    while pos < len(source):
        found = _TOKEN.match(source, pos)
        if found is None:
            return None
        kind = found.lastgroup or ""
        if kind != "ws":
            out.append(_Tok(kind, found.group(), found.start(), found.end()))
        pos = found.end()
    return out


def _close(toks: list[_Tok], i: int) -> int | None:
    """The index of the bracket closing the one at `i`."""
    depth = 0
    for j in range(i, len(toks)):
        t = toks[j].text if toks[j].kind == "op" else ""
        if t in ("(", "[", "{"):
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return j
    return None


def unbox_source(source: str, names: frozenset[str], prefix: str) -> str | None:
    """`source` with each call of a function in `names` — ``f(x)`` or ``x.f()`` — made a call of its boxed
    companion unwrapped: ``<prefix>f(x).value()`` (see `proctor.policy.functions.CelFunction.box`).
    None when the source does not tokenise, or a name is used other than as a call."""
    toks = _tokens(source)
    if toks is None:
        return None
    edits: list[tuple[int, str]] = []  # (offset, text to insert)
    for i, tok in enumerate(toks):
        if tok.kind != "id" or tok.text not in names:
            continue
        if i + 1 >= len(toks) or toks[i + 1].text != "(":
            return None  # a bound variable or field of that name: leave the whole source as it is
        close = _close(toks, i + 1)
        if close is None:
            return None
        edits.append((tok.start, prefix))
        edits.append((toks[close].end, ".value()"))
    out, last = [], 0
    for offset, text in sorted(edits, key=lambda edit: edit[0]):
        out.append(source[last:offset])
        out.append(text)
        last = offset
    out.append(source[last:])
    return "".join(out)


def _split_args(toks: list[_Tok], lo: int, hi: int) -> list[tuple[int, int]]:
    """Top-level comma-separated ranges [a, b) of tokens lo..hi (exclusive)."""
    parts, depth, start = [], 0, lo
    for j in range(lo, hi):
        t = toks[j].text if toks[j].kind == "op" else ""
        if t in ("(", "[", "{"):
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
        elif t == "," and depth == 0:
            parts.append((start, j))
            start = j + 1
    if start < hi:
        parts.append((start, hi))
    return parts


def _is_local(toks: list[_Tok], lo: int, hi: int, bound: str) -> bool:
    """Whether tokens lo..hi read nothing but `bound`, names they bind themselves, and pure functions."""
    names = {bound}
    for j in range(lo, hi - 3):  # names bound by nested macros: `.exists(t, …`
        if (toks[j].text == "." and toks[j + 1].text in _MACROS and toks[j + 2].text == "("
                and toks[j + 3].kind == "id"):
            names.add(toks[j + 3].text)
    for j in range(lo, hi):
        tok = toks[j]
        if tok.kind != "id":
            continue
        after_dot = j > lo and toks[j - 1].text == "." and toks[j - 1].kind == "op"
        called = j + 1 < hi and toks[j + 1].text == "("
        if called:
            if not _pure(tok.text):
                return False
        elif after_dot or tok.text in names or tok.text in _KEYWORDS or tok.text in _TYPE_NAMES:
            continue
        else:
            return False
    return True


def _text(source: str, toks: list[_Tok], lo: int, hi: int) -> str:
    return source[toks[lo].start : toks[hi - 1].end]


# -- pipelines -----------------------------------------------------------------------------------

class _Program:
    """A stage's CEL program and the registered functions it calls."""

    __slots__ = ("functions", "program")

    def __init__(self, source: str) -> None:
        try:
            self.program = cel.compile(source)
        except Exception:  # noqa: BLE001 - let CEL itself report it when the whole condition compiles
            raise _NotLocal from None
        self.functions = {fn: CEL_FUNCTIONS[fn].callable_for(None)
                          for fn in self.program.functions() if fn in CEL_FUNCTIONS}

    def run(self, var: str, value: Any) -> Any:
        from proctor.policy.conditions import ValueTooDeep, check_value  # (conditions imports this module)

        try:
            check_value(value)  # a cyclic or absurdly deep entry would crash CEL's native converter
        except ValueTooDeep as exc:
            raise _Failure(str(exc)) from None
        try:
            if self.functions:
                return self.program.execute(cel.Context({var: value}, self.functions))
            return self.program.execute({var: value})
        except Exception as exc:  # noqa: BLE001 - any CEL error is the pipeline's error for this entry
            text = str(exc).strip()
            raise _Failure(text.splitlines()[0] if text else type(exc).__name__) from None


_Stage = tuple[str, str, _Program]  # (kind "filter" | "map", bound name, program)


class Pipeline:
    """One entry-local pipeline over `history`; interned, immutable, shared by every run."""

    __slots__ = ("fields", "key", "name", "stages", "terminal", "terminal_program", "terminal_var")

    def __init__(self, key: str, name: str, stages: tuple[_Stage, ...], terminal: str | None,
                 terminal_var: str, terminal_program: Any, fields: frozenset[str] | None) -> None:
        self.key, self.name, self.stages = key, name, stages
        self.terminal, self.terminal_var, self.terminal_program = terminal, terminal_var, terminal_program
        self.fields = fields  # the entry fields the first stage reads (None: the whole entry)

    def new_fold(self, start: int = 0) -> Fold:
        """A fold of this pipeline that has seen nothing; `start` entries were dropped before it began."""
        return Fold(self, start)

    def entry(self, row_dict: Mapping[str, Any]) -> Any:
        if self.fields is None:
            return row_dict
        return {f: row_dict[f] for f in self.fields if f in row_dict}

    def __repr__(self) -> str:
        return f"Pipeline({self.name}: {self.key})"


_REGISTRY: dict[str, Pipeline] = {}
_BY_NAME: dict[str, Pipeline] = {}
_REGISTRY_LOCK = threading.Lock()


def pipeline_named(name: str) -> Pipeline:
    """The pipeline behind a hidden function name (``__h3``)."""
    return _BY_NAME[name]


class _NotLocal(Exception):
    pass


def _intern(key: str, build: Callable[[str], Pipeline]) -> Pipeline:
    with _REGISTRY_LOCK:
        found = _REGISTRY.get(key)
        if found is None:
            found = build(f"__h{len(_REGISTRY)}")
            _REGISTRY[key] = found
            _BY_NAME[found.name] = found
        return found


def _entry_fields(source: str, toks: list[_Tok], stages: list[tuple[str, str, int, int]],
                  terminal: tuple[str, str, int, int] | None) -> frozenset[str] | None:
    """The entry fields the pipeline reads (None: the whole entry): those of every stage that
    sees entries as they are, up to the first map()."""
    from proctor.policy.projection import selected_fields

    consumers = []
    for kind, var, lo, hi in stages:
        consumers.append((var, lo, hi))
        if kind == "map":
            break
    else:
        if terminal is None or terminal[0] == "sum":
            return None  # the entries themselves are the value
        if terminal[0] != "size":
            consumers.append((terminal[1], terminal[2], terminal[3]))
    fields: set[str] = set()
    for var, lo, hi in consumers:
        found = selected_fields(_text(source, toks, lo, hi), var)
        if found is None:
            return None
        fields |= found
    return frozenset(fields)


class Rewrite:
    """A condition's source with its entry-local history pipelines replaced by hidden names.

    `source` reads each pipeline's value as a variable (``__h3``: a variable costs CEL nothing
    to read, a Python function call ~10 µs); `calls_source` calls ``__h3()`` instead, for the
    rare decision where a pipeline's value is an error that CEL's ``||``/``&&`` may absorb.
    """

    __slots__ = ("calls_source", "pipelines", "source")

    def __init__(self, source: str, calls_source: str, pipelines: tuple[Pipeline, ...]) -> None:
        self.source, self.calls_source, self.pipelines = source, calls_source, pipelines


def rewrite(source: str) -> Rewrite | None:
    """Replace each entry-local history pipeline of `source` by ``__hN``; None when there is none."""
    toks = _tokens(source)
    if toks is None:
        return None
    # A macro binding the name `history` would shadow it: leave such a source alone.
    for j in range(len(toks) - 3):
        if toks[j].text == "." and toks[j + 1].text in _MACROS and toks[j + 3].text == "history":
            return None
    edits: list[tuple[int, int, Pipeline]] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.kind != "id" or tok.text != "history" or (i > 0 and toks[i - 1].text == "."):
            i += 1
            continue
        found = _pipeline_at(source, toks, i)
        if found is None:
            i += 1
            continue
        lo, hi, pipeline = found
        edits.append((toks[lo].start, toks[hi - 1].end, pipeline))
        i = hi
    if not edits:
        return None
    def spliced(suffix: str) -> str:
        out, last = [], 0
        for start, end, pipeline in edits:
            out.append(source[last:start])
            out.append(pipeline.name + suffix)
            last = end
        out.append(source[last:])
        return "".join(out)

    return Rewrite(spliced(""), spliced("()"), tuple(dict.fromkeys(p for _, _, p in edits)))


def _pipeline_at(source: str, toks: list[_Tok], i: int) -> tuple[int, int, Pipeline] | None:
    """The longest entry-local pipeline starting at the `history` token `i`: token range and pipeline."""
    stages: list[tuple[str, str, int, int]] = []  # (kind, bound var, body lo, body hi)
    terminal: tuple[str, str, int, int] | None = None
    j = i + 1
    while j + 2 < len(toks) and toks[j].text == "." and toks[j + 1].kind == "id" and toks[j + 2].text == "(":
        method = toks[j + 1].text
        close = _close(toks, j + 2)
        if close is None:
            return None
        args = _split_args(toks, j + 3, close)
        if method in ("size", "sum") and not args:
            terminal = (method, "", 0, 0)
            j = close + 1
            break
        if method not in _MACROS or len(args) not in (2, 3) or args[0][1] - args[0][0] != 1:
            break
        var = toks[args[0][0]].text
        if toks[args[0][0]].kind != "id" or not all(_is_local(toks, a, b, var) for a, b in args[1:]):
            break
        if len(args) == 3:
            if method != "map":
                break
            stages.append(("filter", var, *args[1]))
            stages.append(("map", var, *args[2]))
        elif method in ("filter", "map"):
            stages.append((method, var, *args[1]))
        else:
            terminal = (method, var, *args[1])
            j = close + 1
            break
        j = close + 1
    lo, hi = i, j
    if terminal is None and i >= 2 and toks[i - 1].text == "(" and toks[i - 2].text in ("size", "sum") \
            and (i < 3 or toks[i - 3].text != ".") and j < len(toks) and toks[j].text == ")":
        terminal = (toks[i - 2].text, "", 0, 0)
        lo, hi = i - 2, j + 1
    if not stages and terminal is None:
        return None
    key = " ".join(t.text for t in toks[lo:hi])

    def build(name: str) -> Pipeline:
        compiled = tuple((kind, var, _Program(_text(source, toks, a, b))) for kind, var, a, b in stages)
        t_kind, t_var, t_prog = None, "", None
        if terminal is not None:
            t_kind, t_var = terminal[0], terminal[1]
            if t_var:
                t_prog = _Program(_text(source, toks, terminal[2], terminal[3]))
        return Pipeline(key, name, compiled, t_kind, t_var, t_prog, _entry_fields(source, toks, stages, terminal))

    try:
        return lo, hi, _intern(key, build)
    except _NotLocal:
        return None


# -- folding -------------------------------------------------------------------------------------


class AggregateError(ValueError):
    """A pipeline whose value is an error (CEL's message for the entry that caused it)."""


def is_hidden(name: str) -> bool:
    """Whether `name` is a pipeline's hidden variable (``__h3``)."""
    return name.startswith("__h") and name in _BY_NAME


class _Failure(Exception):
    """An entry made the pipeline fail; the message is CEL's."""


class Fold:
    """The running value of one pipeline over one run's entries, fed one entry at a time.

    It follows the `cel` package's evaluation order exactly: a filter()/map() stage runs over
    every entry before the next stage, so an error there is the value whatever came before;
    ``exists``/``all`` stop at the first entry that decides them (true/false, or an error);
    ``exists_one``, ``size``, ``sum`` and a plain list see every entry.
    """

    __slots__ = ("count", "decided", "fatal", "float_total", "items", "pipeline", "pos", "saw_float", "start",
                 "total")

    def __init__(self, pipeline: Pipeline, start: int = 0) -> None:
        self.pipeline = pipeline
        self.start = start  # entries before this were never seen (dropped before the fold began)
        self.pos = start  # the absolute index of the next entry to feed
        self.count = 0  # entries that reached the terminal (size, sum, exists_one)
        self.decided: tuple[bool, Any] | None = None  # exists/all: (True, value) or (False, error text)
        self.fatal: str | None = None  # an error of a stage, exists_one or sum: the value, whatever follows
        self.total = 0  # sum: the ints, exactly; and every item as a double, in order (`cel_sum`'s two answers)
        self.float_total = 0.0
        self.saw_float = False
        self.items: list[Any] = []  # no terminal: the list itself

    def feed(self, entry: Mapping[str, Any]) -> None:
        """Fold one more entry (its `HistoryEntry.as_dict()` form)."""
        self.pos += 1
        if self.fatal is not None:
            return
        p = self.pipeline
        try:
            value: Any = p.entry(entry)
            for kind, var, program in p.stages:
                out = program.run(var, value)
                if kind == "filter":
                    if not isinstance(out, bool):
                        raise _Failure(f"filter() condition gave {type(out).__name__}, not bool")
                    if not out:
                        return
                else:
                    value = out
            self._terminal(value)
        except _Failure as exc:
            self.fatal = str(exc)

    def _terminal(self, value: Any) -> None:
        p = self.pipeline
        t = p.terminal
        if t is None:
            self.items.append(value)
        elif t == "size":
            self.count += 1
        elif t == "sum":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _Failure(f"sum() takes a list of numbers, got a {type(value).__name__} in it")
            self.float_total += float(value)
            if isinstance(value, float):
                self.saw_float = True
            else:
                self.total += value
            self.count += 1
        elif t == "exists_one":
            if _predicate(p, value):
                self.count += 1
        elif self.decided is None:  # exists / all: the first deciding entry wins
            try:
                held = _predicate(p, value)
            except _Failure as exc:
                self.decided = (False, str(exc))
                return
            if held == (t == "exists"):
                self.decided = (True, held)

    def value(self) -> Any:
        """The pipeline's value over every entry fed so far; raises AggregateError when it is an error."""
        if self.fatal is not None:
            raise AggregateError(self.fatal)
        if self.decided is not None:
            ok, result = self.decided
            if not ok:
                raise AggregateError(result)
            return result
        if self.start:
            raise AggregateError(f"the history before call #{self.start + 1} was dropped before this condition "
                             "first ran (raise the history limit)")
        t = self.pipeline.terminal
        if t in ("exists", "all"):
            return t == "all"
        if t == "exists_one":
            return self.count == 1
        if t == "size":
            return self.count
        if t == "sum":
            if self.saw_float:
                return self.float_total
            if not -(2**63) <= self.total < 2**63:
                raise AggregateError("sum() overflows int64")
            return self.total
        return list(self.items)


def _predicate(p: Pipeline, value: Any) -> bool:
    held = p.terminal_program.run(p.terminal_var, value)
    if not isinstance(held, bool):
        raise _Failure(f"{p.terminal}() condition gave {type(held).__name__}, not bool")
    return held


def fold_list(pipeline: Pipeline, entries: Iterable[Mapping[str, Any]]) -> Fold:
    """A fold of `pipeline` over plain entries (history given as a list: explain, policy tests)."""
    fold = pipeline.new_fold()
    for entry in entries:
        fold.feed(entry)
    return fold
