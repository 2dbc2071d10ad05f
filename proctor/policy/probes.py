"""Provenance calls on an argument, answered in Python before CEL runs.

A condition such as ``'untrusted' in provenance(args.to) && !from_user(args.to)`` asks the
run's provenance index about one argument. Called from CEL, each such call costs a round trip
through the `cel` package (bind a callable, convert the argument to Python, call, convert the
answer back: several microseconds, most of a decision's budget). When a condition is compiled,
every call of `provenance`, `text_provenance` or `from_user` whose argument is a plain path
into `args` (``args.to``, ``args.payment.iban``, ``args['to']``) is replaced by a hidden
variable (``__pv3``); the decision computes it in Python from `Call.args` and the index, and
hands it to CEL ready-made (a list of labels as a `cel.OptionalValue` the program unwraps with
``.value()``; `from_user` as a bool). CEL still evaluates the whole condition.

The meaning is CEL's: when a path does not resolve plainly for a call (a missing key, a value
that is not a dict on the way), the condition is evaluated as written instead, so CEL reports
the error (or ``has()``/``||`` absorbs it) exactly as before. Probes are interned process-wide
by function and path, so every rule asking about ``args.to`` shares one per decision.
"""

from __future__ import annotations

import ast
import threading
from dataclasses import dataclass
from typing import Any

from proctor.errors import Unresolved
from proctor.policy.aggregates import closing as _close
from proctor.policy.aggregates import tokenize as _tokens

__all__ = ["PROBE_FUNCTIONS", "Probe", "Unresolved", "is_probe", "probe_named", "rewrite_probes"]

#: The functions whose calls on a path of `args` are answered before CEL runs; True: returns a list.
PROBE_FUNCTIONS: dict[str, bool] = {"provenance": True, "text_provenance": True, "from_user": False}


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
