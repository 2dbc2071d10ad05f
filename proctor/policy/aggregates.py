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

A pipeline whose last predicate also compares entry fields with the call being decided —
``history.exists(h, h.tool == 'refund' && h.args.order == args.order)``, the same with
``all(h, h.tool != 'refund' || h.args.order != args.order)``, ``exists_one`` or
``size(history.filter(h, …))`` — is a *keyed* pipeline (`KeyedFold`): the predicate is a
conjunction (for ``all``, a disjunction) of entry-local terms and equalities ``E == F``
(``E != F``) where ``E`` reads only the entry and ``F`` only the call (`args`, `tool`, `run`,
`side_effect`, `seen`, `usage`). Each entry is classified once, as it is fed: the entry-local
terms and the ``E`` sides are evaluated, and the entry is indexed under its key (the ``E``
values) with its position; an entry the index cannot decide for every call (a term that errs,
a key that is a list or map, a number beyond 2**53) is kept aside, projected, and evaluated as
written at each decision, in order. A decision then evaluates the ``F`` sides once and looks
the key up, so it costs the same at call #10 and #10,000, and the memory is the distinct keys
(and the undecidable entries), never a count of calls.

Every other read of `history` — ``history[0]``, a pipeline mixing entry and call in another
way — is a *bare* pipeline: the run's whole list of entries, projected to the fields the
condition reads, kept for the whole run (so "never twice" means the whole run) and evaluated
as written at each decision (linear in the run). ``history.last(N)`` (or ``last(history, N)``)
is the only window: the last N entries, written by the policy and stated by `policy check`
and `policy explain`.

Pipelines are interned process-wide by their token text, so a thousand rules with the same
``history.exists(…)`` share one fold per run.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from itertools import combinations
from typing import Any, Protocol

from proctor.calls import Call, JSONValue
from proctor.errors import AggregateError, ValueTooDeep
from proctor.policy._cel import cel
from proctor.policy.functions import FUNCTIONS as CEL_FUNCTIONS
from proctor.policy.functions import known_functions
from proctor.policy.values import check_value

__all__ = [
    "FREE_VARIABLES", "PURE_FUNCTIONS", "AggregateError", "CallVariables", "Fold", "KeyedFold", "Pipeline",
    "Rewrite", "WindowFold", "Token", "closing", "fold_list", "history_windows", "is_hidden", "pipeline_named",
    "rewrite", "split_args", "tokenize", "unbox_source", "window_notes",
]


class CallVariables(Protocol):
    """What a keyed pipeline's value reads of the call being decided (`proctor.policy.activation.Activation` is
    one): its condition variables by name, and the call itself (for the functions its residual predicate calls)."""

    def __getitem__(self, name: str) -> JSONValue: ...
    @property
    def call(self) -> Call: ...
    #: The CEL context holding `names` and `functions` for this call, built once per decision.
    def cel_context(self, names: tuple[str, ...], functions: tuple[str, ...] = ()) -> cel.Context: ...


#: The variables of the call being decided that the call side (``F``) of a keyed equality may read.
FREE_VARIABLES = frozenset({"args", "tool", "side_effect", "run", "usage", "seen"})
#: At most this many ``E == F`` terms in one keyed predicate (the index keeps one map per subset of them).
MAX_KEYS = 3

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


#: One CEL token: `kind` (ws, str, num, id, op), `text`, and its `start`/`end` offsets in the source.
Token = _Tok


def tokenize(source: str) -> list[Token] | None:
    """CEL's tokens of `source` without whitespace and comments; None when it is not plain CEL."""
    return _tokens(source)


def closing(toks: list[Token], i: int) -> int | None:
    """The index of the bracket closing the one at `i` (None: unbalanced)."""
    return _close(toks, i)


def split_args(toks: list[Token], lo: int, hi: int) -> list[tuple[int, int]]:
    """The top-level comma-separated token ranges [a, b) of tokens lo..hi."""
    return _split_args(toks, lo, hi)


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
    """One pipeline over `history`; interned, immutable, shared by every run.

    Entry-local stages, then a terminal: an entry-local one (`Fold`), a keyed one (`keyed`, see
    `KeyedFold`), or none (the list itself). `window` (``history.last(N)``): the last N entries.
    """

    __slots__ = ("fields", "key", "keyed", "name", "stages", "terminal", "terminal_program", "terminal_var",
                 "window")

    def __init__(self, key: str, name: str, stages: tuple[_Stage, ...], terminal: str | None,
                 terminal_var: str, terminal_program: Any, fields: frozenset[str] | None,
                 keyed: _Keyed | None = None, window: int | None = None) -> None:
        self.key, self.name, self.stages = key, name, stages
        self.terminal, self.terminal_var, self.terminal_program = terminal, terminal_var, terminal_program
        self.fields = fields  # the entry fields the first stage reads (None: the whole entry)
        self.keyed = keyed
        self.window = window

    def new_fold(self, start: int = 0) -> Fold:
        """A fold of this pipeline that has seen nothing; `start` entries were dropped before it began."""
        if self.keyed is not None:
            return KeyedFold(self, start)
        if self.window is not None:
            return WindowFold(self, start)
        return Fold(self, start)

    def entry(self, row_dict: Mapping[str, Any]) -> Any:
        if self.fields is None:
            return row_dict
        return {f: row_dict[f] for f in self.fields if f in row_dict}

    @property
    def free_sources(self) -> tuple[str, ...]:
        """The call-side expressions (``F``) a decision evaluates for this pipeline (keyed ones only)."""
        return () if self.keyed is None else tuple(k.free_source for k in self.keyed.keys)

    @property
    def free_variables(self) -> frozenset[str]:
        """The variables of the call a decision reads for this pipeline (keyed ones only)."""
        if self.keyed is None:
            return frozenset()
        return frozenset(self.keyed.residual_variables).union(*(k.free_variables for k in self.keyed.keys))

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
    """Replace each history pipeline of `source` by ``__hN``; None when there is none (or on any doubt)."""
    toks = _tokens(source)
    if toks is None:
        return None
    # A macro binding the name `history` would shadow it: leave such a source alone.
    for j in range(len(toks) - 3):
        if toks[j].text == "." and toks[j + 1].text in _MACROS and toks[j + 3].text == "history":
            return None
    from proctor.policy.projection import needs_of

    bare_fields = needs_of(source, ("history",))["history"]
    edits: list[tuple[int, int, Pipeline]] = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok.kind != "id" or tok.text != "history" or (i > 0 and toks[i - 1].text == "."):
            i += 1
            continue
        found = _pipeline_at(source, toks, i, bare_fields)
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


def _pipeline_at(source: str, toks: list[_Tok], i: int,
                 bare_fields: frozenset[str] | None = None) -> tuple[int, int, Pipeline] | None:
    """The longest pipeline starting at the `history` token `i`: token range and pipeline.

    Entry-local stages, then an entry-local or keyed terminal; a bare ``history`` (or the stages
    alone) is the list itself, its entries projected to `bare_fields`; ``history.last(N)`` a window.
    """
    stages: list[tuple[str, str, int, int]] = []  # (kind, bound var, body lo, body hi)
    terminal: tuple[str, str, int, int] | None = None
    keyed: tuple[str, str, int, int] | None = None  # (mode, bound var, predicate lo, hi)
    j = i + 1
    lo = i
    window = _window_at(toks, i)
    if window is not None:
        lo, j, count = window
        return _interned_window(source, toks, lo, j, count)
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
        if toks[args[0][0]].kind != "id":
            break
        if not all(_is_local(toks, a, b, var) for a, b in args[1:]):
            if len(args) == 2 and method in ("exists", "all", "exists_one"):
                if _keyed_spec(source, toks, *args[1], var, method) is not None:
                    keyed = (method, var, *args[1])
                    j = close + 1
            elif len(args) == 2 and method == "filter" and _keyed_spec(source, toks, *args[1], var, "count"):
                sized = _sized(toks, i, close)
                if sized is not None:
                    keyed = ("count", var, *args[1])
                    lo, j = sized
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
    hi = j
    if terminal is None and keyed is None and i >= 2 and toks[i - 1].text == "(" \
            and toks[i - 2].text in ("size", "sum") and (i < 3 or toks[i - 3].text != ".") and j < len(toks) \
            and toks[j].text == ")":
        terminal = (toks[i - 2].text, "", 0, 0)
        lo, hi = i - 2, j + 1
    bare = not stages and terminal is None and keyed is None
    key = " ".join(t.text for t in toks[lo:hi])
    if bare:  # the same text reads different fields in different conditions
        key += " ⟨" + (",".join(sorted(bare_fields)) if bare_fields is not None else "*") + "⟩"

    def build(name: str) -> Pipeline:
        compiled = tuple((kind, var, _Program(_text(source, toks, a, b))) for kind, var, a, b in stages)
        t_kind, t_var, t_prog = None, "", None
        spec = None
        if keyed is not None:
            spec = _keyed_spec(source, toks, keyed[2], keyed[3], keyed[1], keyed[0])
            if spec is None:
                raise _NotLocal
            fields = _entry_fields(source, toks, stages, ("exists", keyed[1], keyed[2], keyed[3]))
        elif bare:
            fields = bare_fields
        else:
            fields = _entry_fields(source, toks, stages, terminal)
        if terminal is not None:
            t_kind, t_var = terminal[0], terminal[1]
            if t_var:
                t_prog = _Program(_text(source, toks, terminal[2], terminal[3]))
        return Pipeline(key, name, compiled, t_kind, t_var, t_prog, fields, keyed=spec)

    try:
        return lo, hi, _intern(key, build)
    except _NotLocal:
        return None


def _sized(toks: list[_Tok], i: int, close: int) -> tuple[int, int] | None:
    """For a filter() ending at token `close`: the token range with its size — ``….size()`` or ``size(…)``."""
    j = close + 1
    if j + 3 < len(toks) and toks[j].text == "." and toks[j + 1].text == "size" and toks[j + 2].text == "(" \
            and toks[j + 3].text == ")":
        return i, j + 4
    if i >= 2 and toks[i - 1].text == "(" and toks[i - 2].text == "size" and (i < 3 or toks[i - 3].text != ".") \
            and j < len(toks) and toks[j].text == ")":
        return i - 2, j + 1
    return None


def _window_at(toks: list[_Tok], i: int) -> tuple[int, int, int] | None:
    """``history.last(N)`` or ``last(history, N)`` at the `history` token `i`, N an int literal:
    (first token, end token, N)."""
    texts = [t.text for t in toks]
    if i + 5 < len(toks) and texts[i + 1 : i + 4] == [".", "last", "("] and toks[i + 4].kind == "num" \
            and texts[i + 5] == ")":
        count = _count_literal(texts[i + 4])
        return None if count is None else (i, i + 6, count)
    if i >= 2 and texts[i - 2 : i] == ["last", "("] and (i < 3 or texts[i - 3] != ".") and i + 3 < len(toks) \
            and texts[i + 1] == "," and toks[i + 2].kind == "num" and texts[i + 3] == ")":
        count = _count_literal(texts[i + 2])
        return None if count is None else (i - 2, i + 4, count)
    return None


def _count_literal(text: str) -> int | None:
    if not text.isdigit():
        return None  # (a double, hex or uint literal: last() itself says what is wrong)
    return int(text)


def _interned_window(source: str, toks: list[_Tok], lo: int, hi: int, count: int) -> tuple[int, int, Pipeline]:
    key = " ".join(t.text for t in toks[lo:hi])
    return lo, hi, _intern(key, lambda name: Pipeline(key, name, (), None, "", None, None, window=count))


def history_windows(source: str) -> tuple[int, ...]:
    """The windows (``history.last(N)``) a condition reads history through, in order; () when none."""
    toks = _tokens(source)
    if toks is None:
        return ()
    found = []
    for i, tok in enumerate(toks):
        if tok.kind == "id" and tok.text == "history" and not (i > 0 and toks[i - 1].text == "."):
            window = _window_at(toks, i)
            if window is not None:
                found.append(window[2])
    return tuple(found)


def window_notes(rules: Iterable[tuple[str, str | None]]) -> tuple[str, ...]:
    """For each (rule name, condition source) reading history through a window it writes, the line saying so
    (`policy check` and `policy explain` print them: a window is never silent)."""
    notes = []
    for name, source in rules:
        windows = history_windows(source) if source else ()
        sizes = [f"the last {n:,} calls" for n in dict.fromkeys(windows)]
        # A window whose size is not a number written in the rule (`history.last(args.n)`) is one too.
        if source and len(_WINDOW_CALL.findall(source)) > len(windows):
            sizes.append("a number of last calls the call itself gives")
        if sizes:
            notes.append(f"rule '{name}' reads {' and '.join(sizes)} of the run (history.last(N), a window it "
                         "writes); every other read of history is over the whole run")
    return tuple(notes)


_WINDOW_CALL = re.compile(r"(?<![\w.])history\s*\.\s*last\s*\(")


# -- keyed pipelines ---------------------------------------------------------------------------------

_RELATIONS = frozenset({"==", "!=", "<", "<=", ">", ">="})


class _Key:
    """One ``E == F`` term: `entry` (a program over the bound name) and the call side's source."""

    __slots__ = ("entry", "free_functions", "free_program", "free_source", "free_variables")

    def __init__(self, entry_source: str, free_source: str) -> None:
        self.entry = _Program(entry_source)
        self.free_source = free_source
        try:
            self.free_program = cel.compile(free_source)
        except Exception:  # noqa: BLE001 - let CEL itself report it when the whole condition compiles
            raise _NotLocal from None
        self.free_variables = tuple(sorted(set(self.free_program.variables()) & FREE_VARIABLES))
        self.free_functions = tuple(sorted(fn for fn in self.free_program.functions() if fn in CEL_FUNCTIONS))


class _Keyed:
    """The keyed terminal of a pipeline: how its predicate splits, and the residual programs."""

    __slots__ = ("keys", "local", "mode", "residual", "residual_functions", "residual_variables", "var")

    def __init__(self, mode: str, var: str, local: tuple[_Program, ...], keys: tuple[_Key, ...],
                 predicate: str) -> None:
        self.mode, self.var, self.local, self.keys = mode, var, local, keys
        # The predicate as written, over the entries no index can decide (in order): `__r` holds them.
        if mode in ("exists", "all"):
            text = f"__r.{mode}({var}, {predicate})"
        else:
            text = f"size(__r.filter({var}, {predicate}))"
        try:
            self.residual = cel.compile(text)
        except Exception:  # noqa: BLE001 - let CEL itself report it when the whole condition compiles
            raise _NotLocal from None
        self.residual_variables = tuple(sorted(set(self.residual.variables()) & FREE_VARIABLES))
        self.residual_functions = tuple(sorted(fn for fn in self.residual.functions() if fn in CEL_FUNCTIONS))


def _depth_zero(toks: list[_Tok], lo: int, hi: int) -> list[int]:
    """Indexes of the tokens lo..hi outside any bracket."""
    out, depth = [], 0
    for j in range(lo, hi):
        t = toks[j].text if toks[j].kind == "op" else ""
        if t in ("(", "[", "{"):
            depth += 1
        elif t in (")", "]", "}"):
            depth -= 1
        elif depth == 0:
            out.append(j)
    return out


def _unwrap(toks: list[_Tok], lo: int, hi: int) -> tuple[int, int]:
    while hi - lo >= 2 and toks[lo].text == "(" and toks[lo].kind == "op" and _close(toks, lo) == hi - 1:
        lo, hi = lo + 1, hi - 1
    return lo, hi


def _terms(toks: list[_Tok], lo: int, hi: int, joiner: str) -> list[tuple[int, int]]:
    """The operands of a top-level chain of `joiner` (``&&`` or ``||``), parentheses flattened."""
    lo, hi = _unwrap(toks, lo, hi)
    top = [j for j in _depth_zero(toks, lo, hi) if toks[j].kind == "op"]
    other = "||" if joiner == "&&" else "&&"
    texts = {toks[j].text for j in top}
    if joiner not in texts or other in texts or "?" in texts:
        return [(lo, hi)]  # one term (a lower-precedence operator, if any, binds the whole)
    out, start = [], lo
    for j in top:
        if toks[j].text == joiner:
            out.extend(_terms(toks, start, j, joiner))
            start = j + 1
    out.extend(_terms(toks, start, hi, joiner))
    return out


def _reads(toks: list[_Tok], lo: int, hi: int, name: str) -> bool:
    return any(toks[j].kind == "id" and toks[j].text == name and not (j > lo and toks[j - 1].text == ".")
               for j in range(lo, hi))


def _call_side(toks: list[_Tok], lo: int, hi: int, var: str) -> bool:
    """Whether tokens lo..hi read only the call being decided (`FREE_VARIABLES`), literals and known functions."""
    names = set(FREE_VARIABLES)
    for j in range(lo, hi - 3):
        if toks[j].text == "." and toks[j + 1].text in _MACROS and toks[j + 2].text == "(" and toks[j + 3].kind == "id":
            names.add(toks[j + 3].text)
    known = known_functions()
    for j in range(lo, hi):
        tok = toks[j]
        if tok.kind != "id" or tok.text in _KEYWORDS or tok.text in _TYPE_NAMES:
            continue
        if tok.text in (var, "history"):
            return False
        after_dot = j > lo and toks[j - 1].text == "." and toks[j - 1].kind == "op"
        if j + 1 < hi and toks[j + 1].text == "(":
            if tok.text not in known:
                return False
        elif not after_dot and tok.text not in names:
            return False
    return True


def _keyed_spec(source: str, toks: list[_Tok], lo: int, hi: int, var: str, mode: str) -> _Keyed | None:
    """The keyed form of predicate tokens lo..hi over `var` (None: not one; see the module docstring)."""
    if var in FREE_VARIABLES or var == "history":
        return None
    joiner, relation = ("||", "!=") if mode == "all" else ("&&", "==")
    local: list[_Program] = []
    keys: list[_Key] = []
    try:
        for a, b in _terms(toks, lo, hi, joiner):
            if _is_local(toks, a, b, var):
                local.append(_Program(_text(source, toks, a, b)))
                continue
            top = [j for j in _depth_zero(toks, a, b) if (toks[j].kind == "op" and toks[j].text in _RELATIONS)
                   or (toks[j].kind == "id" and toks[j].text == "in")]
            if len(top) != 1 or toks[top[0]].text != relation or any(
                    toks[j].text in ("?", ":", "&&", "||") for j in _depth_zero(toks, a, b)):
                return None
            r = top[0]
            sides = [(a, r), (r + 1, b)]
            if any(x >= y for x, y in sides):
                return None
            entry = [sd for sd in sides if _is_local(toks, *sd, var) and _reads(toks, *sd, var)]
            free = [sd for sd in sides if _call_side(toks, *sd, var)]
            if len(entry) != 1 or len(free) != 1 or entry[0] == free[0]:
                return None
            keys.append(_Key(_text(source, toks, *entry[0]), _text(source, toks, *free[0])))
    except _NotLocal:
        return None
    if not keys or len(keys) > MAX_KEYS:
        return None
    macro_vars = set(re.findall(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,", source))
    if macro_vars & FREE_VARIABLES:
        return None  # a call variable's name is bound by some macro: the call side may not mean the call
    try:
        return _Keyed(mode, var, tuple(local), tuple(keys), _text(source, toks, lo, hi))
    except _NotLocal:
        return None


# -- folding -------------------------------------------------------------------------------------


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

    def value_in(self, activation: CallVariables) -> Any:
        """The value for the call `activation` decides (`proctor.policy.activation.Activation`): an
        entry-local pipeline's value is the same for every call (`value`); a keyed one reads the call."""
        return self.value()

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


class WindowFold(Fold):
    """``history.last(N)``: the last N entries, kept as they come (the window the policy wrote)."""

    __slots__ = ("recent",)

    def __init__(self, pipeline: Pipeline, start: int = 0) -> None:
        super().__init__(pipeline, start)
        self.recent: deque[Any] = deque(maxlen=pipeline.window)

    def feed(self, entry: Mapping[str, Any]) -> None:
        self.pos += 1
        self.recent.append(entry)

    def value(self) -> Any:
        window = self.pipeline.window or 0
        if self.start and self.pos - window < self.start:
            raise AggregateError(f"the history before call #{self.start + 1} was dropped before this condition "
                                 "first ran")
        return list(self.recent)


_UNCLEAN: Any = object()
_EXACT = 2**53  # below it, every int is a double and back: Python's == on numbers is CEL's


def _clean(value: Any) -> Any:
    """`value` as a dict key equal to another exactly when CEL's ``==`` says the values are (else _UNCLEAN).

    CEL's equality across types is false (``1 == '1'``, ``true == 1``), across int and double
    numeric (``1 == 1.0``); a bool is tagged so Python's ``True == 1`` cannot match it.
    """
    kind = type(value)
    if kind is str or kind is bytes or value is None:
        return value
    if kind is bool:
        return (bool, value)
    if kind is int:
        return value if -_EXACT < value < _EXACT else _UNCLEAN
    if kind is float:
        return value if value == value and -_EXACT < value < _EXACT else _UNCLEAN  # (NaN is never equal)
    return _UNCLEAN


class KeyedFold(Fold):
    """A keyed pipeline's index over one run: per subset of its keys, each key's first position and count.

    Fed entries are classified once (see the module docstring). For a decision, `value_in`
    evaluates the call sides, looks the key up, and evaluates as written only the entries kept
    aside (`residual`); the result is CEL's for the whole list, errors included: ``exists`` and
    ``all`` are decided by the first entry that decides them, ``exists_one`` and ``size(filter())``
    are errors when any entry errs.
    """

    __slots__ = ("firsts", "residual", "subsets", "tallies")

    def __init__(self, pipeline: Pipeline, start: int = 0) -> None:
        super().__init__(pipeline, start)
        keyed = pipeline.keyed
        assert keyed is not None
        m = len(keyed.keys)
        self.subsets = [c for r in range(m + 1) for c in combinations(range(m), r)]
        self.firsts: dict[tuple[int, ...], dict[tuple[Any, ...], int]] = {c: {} for c in self.subsets}
        self.tallies: dict[tuple[int, ...], dict[tuple[Any, ...], int]] = {c: {} for c in self.subsets}
        self.residual: list[tuple[int, Any]] = []  # (position, entry) the index cannot decide for every call

    def _terminal(self, value: Any) -> None:
        keyed = self.pipeline.keyed
        assert keyed is not None
        position = self.pos - 1
        # For exists/exists_one/count the predicate is a conjunction: an entry-local term that is false
        # makes it false for every call, whatever else errs (CEL's && absorbs errors); for all() the
        # predicate is a disjunction and a true term makes it true (never deciding) alike.
        skip = keyed.mode == "all"
        unsure = False
        for program in keyed.local:
            try:
                out = program.run(keyed.var, value)
            except _Failure:
                unsure = True
                continue
            if not isinstance(out, bool):
                unsure = True  # (CEL treats a non-bool operand of &&/|| as an error: absorbed alike)
            elif out is skip:
                return
        if not unsure:
            key = []
            for k in keyed.keys:
                try:
                    clean = _clean(k.entry.run(keyed.var, value))
                except _Failure:
                    clean = _UNCLEAN
                if clean is _UNCLEAN:
                    unsure = True
                    break
                key.append(clean)
        if unsure:
            self.residual.append((position, value))
            return
        for subset in self.subsets:
            part = tuple(key[j] for j in subset)
            firsts = self.firsts[subset]
            if part not in firsts:
                firsts[part] = position
            tallies = self.tallies[subset]
            tallies[part] = tallies.get(part, 0) + 1

    def value(self) -> Any:
        raise AggregateError("a keyed history pipeline has a value only for a call")

    def value_in(self, activation: CallVariables) -> Any:
        if self.fatal is not None:
            raise AggregateError(self.fatal)
        if self.start:
            raise AggregateError(f"the history before call #{self.start + 1} was dropped before this condition "
                                 "first ran")
        keyed = self.pipeline.keyed
        assert keyed is not None
        subset, part, failed = [], [], None
        matchable = True
        for j, k in enumerate(keyed.keys):
            # (a value CEL cannot take raises here, as the condition as written would)
            context = activation.cel_context(k.free_variables, k.free_functions)
            try:
                free = k.free_program.execute(context)
            except Exception as exc:  # noqa: BLE001 - CEL's error for the call side: the entries that reach it err
                failed = failed or _message(exc)
                continue
            subset.append(j)
            clean = _clean(free)
            if clean is _UNCLEAN:
                matchable = False  # a list, map, NaN or huge number: equal to no indexed (scalar) key
            part.append(clean)
        at = tuple(subset)
        first = self.firsts[at].get(tuple(part)) if matchable else None
        count = self.tallies[at].get(tuple(part), 0) if matchable else 0
        mode = keyed.mode
        if mode in ("exists", "all"):
            earlier = [e for pos, e in self.residual if first is None or pos < first]
            if earlier:
                decided = self._residual(activation, earlier)
                if decided is (mode == "exists"):
                    return decided
            if first is None:
                return mode == "all"
            if failed is not None:
                raise AggregateError(failed)
            return mode == "exists"
        extra = self._residual(activation, [e for _, e in self.residual]) if self.residual else 0
        if count and failed is not None:
            raise AggregateError(failed)
        total = count + extra
        return total == 1 if mode == "exists_one" else total

    def _residual(self, activation: CallVariables, entries: list[Any]) -> Any:
        keyed = self.pipeline.keyed
        assert keyed is not None
        variables = {name: activation[name] for name in keyed.residual_variables}
        try:
            check_value(entries)
        except ValueTooDeep as exc:
            raise AggregateError(str(exc)) from None
        variables["__r"] = entries
        functions = {fn: CEL_FUNCTIONS[fn].callable_for(activation.call) for fn in keyed.residual_functions}
        try:
            return keyed.residual.execute(cel.Context(variables, functions))
        except Exception as exc:  # noqa: BLE001 - the predicate's error as CEL gives it
            raise AggregateError(_message(exc)) from None


def _message(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def fold_list(pipeline: Pipeline, entries: Iterable[Mapping[str, Any]]) -> Fold:
    """A fold of `pipeline` over plain entries (history given as a list: explain, policy tests)."""
    fold = pipeline.new_fold()
    for entry in entries:
        fold.feed(entry)
    return fold
