"""Provenance calls on an argument, answered in Python before CEL runs.

A condition such as ``'untrusted' in provenance(args.to) && !from_user(args.to)`` asks the
run's provenance index about one argument. Called from CEL, each such call costs a round trip
through the `cel` package (bind a callable, convert the argument to Python, call, convert the
answer back: several microseconds, most of a decision's budget). When a condition is compiled,
every call of `provenance`, `text_provenance` or `from_user` whose argument is a plain path
into `args` (``args.to``, ``args.payment.iban``, ``args['to']``) is replaced by a hidden
variable (``__pv3``); the decision computes it in Python from `Call.args` and the index, and
hands it to CEL ready-made (a list of labels as a `cel.OptionalValue` the program unwraps with
``.value()``; `from_user` as a bool).

A condition made only of such calls joined by ``in`` (a string literal in a list of labels), ``!``,
``&&``, ``||``, parentheses and ``true``/``false`` is also compiled to a Python function
(`python_condition`): for a call whose arguments at those paths are plain strings, numbers or
null, it is decided without CEL at all (no conversion of `args`, no context).

The meaning is CEL's: when a path does not resolve plainly for a call (a missing key, a value
that is not a dict on the way), the condition is evaluated as written instead, so CEL reports
the error (or ``has()``/``||`` absorbs it) exactly as before. Probes are interned process-wide
by function and path, so every rule asking about ``args.to`` shares one per decision.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proctor.policy.aggregates import closing as _close
from proctor.policy.aggregates import tokenize as _tokens

__all__ = ["PROBE_FUNCTIONS", "Probe", "Unresolved", "is_probe", "probe_named", "python_condition", "rewrite_probes",
           "split_conjunction"]

#: The functions whose calls on a path of `args` are answered before CEL runs; True: returns a list.
PROBE_FUNCTIONS: dict[str, bool] = {"provenance": True, "text_provenance": True, "from_user": False}


class Unresolved(LookupError):
    """A probe's path does not resolve plainly for this call: evaluate the condition as written."""


@dataclass(frozen=True, slots=True)
class Probe:
    """One function applied to one path of `args`, named by its hidden variable."""

    name: str
    function: str
    path: tuple[str, ...]

    def argument(self, args: Any) -> Any:
        """The value at `path` in `args`; raises `Unresolved` when a key is missing or a step is no dict."""
        value = args
        for key in self.path:
            if type(value) is not dict:
                raise Unresolved(self.name)
            try:
                value = value[key]
            except KeyError:
                raise Unresolved(self.name) from None
        return value


_LOCK = threading.Lock()
_BY_KEY: dict[tuple[str, tuple[str, ...]], Probe] = {}
_BY_NAME: dict[str, Probe] = {}


def _intern(function: str, path: tuple[str, ...]) -> Probe:
    with _LOCK:
        probe = _BY_KEY.get((function, path))
        if probe is None:
            probe = Probe(f"__pv{len(_BY_KEY)}", function, path)
            _BY_KEY[(function, path)] = probe
            _BY_NAME[probe.name] = probe
        return probe


def is_probe(name: str) -> bool:
    """Whether `name` is a probe's hidden variable (``__pv3``)."""
    return name.startswith("__pv") and name in _BY_NAME


def probe_named(name: str) -> Probe:
    """The probe a hidden variable stands for."""
    return _BY_NAME[name]


def _key(text: str) -> str | None:
    """The text of a plain quoted string literal (``'to'``), else None."""
    if text[:1] not in ("'", '"') or text[:3] in ("'''", '"""') or "\\" in text:
        return None
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def rewrite_probes(source: str) -> tuple[str, tuple[Probe, ...]] | None:
    """`source` with each probe-able call replaced by its hidden variable, and the probes; None when none."""
    toks = _tokens(source)
    if toks is None:
        return None
    edits: list[tuple[int, int, str]] = []
    probes: list[Probe] = []
    for i, tok in enumerate(toks):
        if tok.kind != "id" or tok.text not in PROBE_FUNCTIONS or (i > 0 and toks[i - 1].text == "."):
            continue
        if i + 2 >= len(toks) or toks[i + 1].text != "(" or toks[i + 2].text != "args":
            continue
        close = _close(toks, i + 1)
        if close is None:
            continue
        path: list[str] = []
        j = i + 3
        while j < close:
            if toks[j].text == "." and j + 1 < close and toks[j + 1].kind == "id":
                path.append(toks[j + 1].text)
                j += 2
            elif (toks[j].text == "[" and j + 2 < close and toks[j + 1].kind == "str" and toks[j + 2].text == "]"
                  and (key := _key(toks[j + 1].text)) is not None):
                path.append(key)
                j += 3
            else:
                break
        if j != close or not path:
            continue
        probe = _intern(tok.text, tuple(path))
        probes.append(probe)
        edits.append((tok.start, toks[close].end, probe.name + (".value()" if PROBE_FUNCTIONS[tok.text] else "")))
    if not edits:
        return None
    out, last = [], 0
    for start, end, text in edits:
        out.append(source[last:start])
        out.append(text)
        last = end
    out.append(source[last:])
    return "".join(out), tuple(dict.fromkeys(probes))


# -- conditions made only of probes ----------------------------------------------------------------

#: A compiled condition: given a function answering a probe's hidden name, its value.
PythonCondition = Callable[[Callable[[str], Any]], bool]


def python_condition(source: str) -> PythonCondition | None:
    """`source` as a Python function when it is made only of probe-able calls, ``in``, ``!``, ``&&``,
    ``||``, parentheses and ``true``/``false`` (CEL's precedence); None otherwise.

    The function asks `answer(name)` for each probe it reaches (short-circuiting as CEL does; no term can
    fail, so evaluation order does not change the value): a tuple of labels, or from_user's bool.
    """
    toks = _tokens(source)
    if not toks:
        return None
    parser = _Parser(source, toks)
    try:
        fn = parser.disjunction()
    except _Unsupported:
        return None
    return fn if parser.at == len(toks) else None


def split_conjunction(source: str) -> tuple[PythonCondition, str] | None:
    """For a condition ``a && b && c`` (``&&`` at the top, no ``||`` nor ``?:`` there) some of whose terms are
    made only of probes (`python_condition`) and some not: those terms as one Python function, and the others
    as CEL source; None otherwise.

    CEL's ``&&`` is false as soon as one term is false, whatever the others (an error included), and else
    is the value of the remaining terms: so a decision answers the Python terms first and runs CEL only
    when they all hold — on the other terms alone, without the probes' hidden variables.
    """
    toks = _tokens(source)
    if not toks:
        return None
    parts: list[list[Any]] = [[]]
    depth = 0
    for tok in toks:
        text = tok.text if tok.kind == "op" else ""
        if text in ("(", "[", "{"):
            depth += 1
        elif text in (")", "]", "}"):
            depth -= 1
        elif depth == 0 and text in ("||", "?", ":"):
            return None
        elif depth == 0 and text == "&&":
            parts.append([])
            continue
        parts[-1].append(tok)
    if len(parts) < 2 or not all(parts):
        return None
    terms = [" ".join(tok.text for tok in part) for part in parts]  # (no comment survives to swallow a bracket)
    python = [term for term in terms if python_condition(term) is not None]
    rest = [term for term in terms if python_condition(term) is None]
    if not python or not rest:
        return None
    head = python_condition(" && ".join(f"({term})" for term in python))
    if head is None:
        return None
    return head, " && ".join(f"({term})" for term in rest)


class _Unsupported(Exception):
    pass


class _Parser:
    def __init__(self, source: str, toks: list[Any]) -> None:
        self.source, self.toks, self.at = source, toks, 0

    def _peek(self, offset: int = 0) -> Any:
        at = self.at + offset
        return self.toks[at] if at < len(self.toks) else None

    def _take(self, text: str) -> bool:
        tok = self._peek()
        if tok is not None and tok.text == text and tok.kind in ("op", "id"):
            self.at += 1
            return True
        return False

    def disjunction(self) -> PythonCondition:
        terms = [self.conjunction()]
        while self._take("||"):
            terms.append(self.conjunction())
        if len(terms) == 1:
            return terms[0]
        if len(terms) == 2:
            first, second = terms
            return lambda answer: first(answer) or second(answer)
        return lambda answer: any(term(answer) for term in terms)

    def conjunction(self) -> PythonCondition:
        terms = [self.unary()]
        while self._take("&&"):
            terms.append(self.unary())
        if len(terms) == 1:
            return terms[0]
        if len(terms) == 2:
            first, second = terms
            return lambda answer: first(answer) and second(answer)
        return lambda answer: all(term(answer) for term in terms)

    def unary(self) -> PythonCondition:
        if self._take("!"):
            tok = self._peek()
            if tok is not None and tok.kind == "str":  # CEL reads `!'a' in x` as `(!'a') in x`: an error
                raise _Unsupported
            inner = self.unary()
            return lambda answer: not inner(answer)
        return self.primary()

    def primary(self) -> PythonCondition:
        tok = self._peek()
        if tok is None:
            raise _Unsupported
        if self._take("("):
            inner = self.disjunction()
            if not self._take(")"):
                raise _Unsupported
            return inner
        if tok.kind == "id" and tok.text in ("true", "false"):
            self.at += 1
            constant = tok.text == "true"
            return lambda answer: constant
        if tok.kind == "str":
            label = _key(tok.text)
            self.at += 1
            if label is None or not self._take("in"):
                raise _Unsupported
            name = self.call(lists=True)
            return lambda answer: label in answer(name)
        name = self.call(lists=False)
        return lambda answer: answer(name)

    def call(self, *, lists: bool) -> str:
        """A probe-able call here: its hidden name (a list function when `lists`, else from_user)."""
        tok = self._peek()
        if tok is None or tok.kind != "id" or PROBE_FUNCTIONS.get(tok.text) is not lists:
            raise _Unsupported
        close = _close(self.toks, self.at + 1) if self._peek(1) is not None and self._peek(1).text == "(" else None
        if close is None:
            raise _Unsupported
        found = rewrite_probes(self.source[tok.start : self.toks[close].end])
        if found is None or len(found[1]) != 1 or found[0] != found[1][0].name + (".value()" if lists else ""):
            raise _Unsupported
        self.at = close + 1
        return found[1][0].name
