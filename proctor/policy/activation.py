"""The variables of one call as CEL sees them, converted once per decision and only as far as needed.

Converting a Python value to CEL costs about a microsecond per string or map, which
is most of what a decision costs; so an `Activation` builds each variable on first
use, projects it to the fields the candidate conditions read (see
`proctor.policy.projection`), and adds it to one `cel.Context` shared by every
condition evaluated for the call.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from proctor.calls import Call, HistoryEntry, TrimmedHistory
from proctor.policy._cel import cel
from proctor.policy.aggregates import Fold, fold_list, is_hidden, pipeline_named
from proctor.policy.functions import FUNCTIONS, boxed
from proctor.policy.probes import is_probe, probe_named
from proctor.policy.projection import Needs
from proctor.policy.values import check_value

__all__ = ["Activation"]

_PLAIN_FOLD_MIN = 32
_UNSET: Any = object()
_ENTRY_FIELDS = frozenset(("tool", "args", "side_effect", "decision", "status", "labels"))  # HistoryEntry.as_dict()


class Activation(Mapping[str, Any]):
    """The CEL variables of one call, each built on first use and shared by every rule."""

    __slots__ = ("_added", "_cache", "_call", "_context", "_folds", "_functions", "_needs", "_side_effect",
                 "folds_history")

    def __init__(
        self, call: Call, side_effect: str, needs: Needs | None = None, functions: tuple[str, ...] = (),
        plain_needs: Needs | None = None,
    ) -> None:
        self._call = call
        self._side_effect = side_effect
        history = call.history
        #: Whether conditions read history through folds (hidden variables). A run's history keeps them
        #: incrementally; a short plain list (Policy.decide, policy tests) is cheaper given to CEL whole,
        #: as before folds existed: folding it costs one CEL execution per entry and stage.
        self.folds_history = isinstance(history, TrimmedHistory) or len(history) > _PLAIN_FOLD_MIN
        # Without folds, the fold needs do not apply: the plain ones, or none (whole values).
        self._needs = (needs if self.folds_history else plain_needs) or {}
        self._functions = functions
        self._cache: dict[str, Any] = {}
        self._context: Any = None
        self._added: set[str] = set()
        self._folds: dict[str, Fold] = {}

    def prepare(self) -> None:
        """Convert every variable the candidate conditions read in one go (cheaper than one by one).

        If any of them cannot be converted, nothing is: each condition then converts what
        it reads itself, so only the conditions reading the bad value fail.
        """
        if not self._needs:
            return
        try:
            values = {name: self[name] for name in self._needs}
            for value in values.values():
                check_value(value)
            context = cel.Context(values)
        except Exception:  # noqa: BLE001 - fall back to per-condition conversion, which reports the error
            return
        added = set(values)
        for fn in self._functions:  # registered functions the candidate conditions call
            context.add_function(fn, FUNCTIONS[fn].callable_for(self._call))
            added.add("()" + fn)
        self._context, self._added = context, added

    def cel_context(self, names: tuple[str, ...], functions: tuple[str, ...] = ()) -> Any:
        """One `cel.Context` per decision: converting a variable costs microseconds, so do it once."""
        if self._context is None:
            self._context = cel.Context()
        for name in names:
            if name not in self._added:
                if name.startswith("__pv"):  # a probe: a bool or a cel.OptionalValue, nothing to check
                    value = self._probe(name)  # raises probes.Unresolved when its path does not resolve
                else:
                    value = self[name]
                    check_value(value)  # a cyclic or absurdly deep value would crash the converter
                self._context.add_variable(name, value)
                self._added.add(name)
        for fn in functions:
            if "()" + fn not in self._added:
                self._context.add_function(fn, FUNCTIONS[fn].callable_for(self._call))
                self._added.add("()" + fn)
        return self._context

    def __getitem__(self, name: str) -> Any:
        value: Any = self._cache.get(name, _UNSET)  # (not try/except: a miss, the usual case, raised)
        if value is not _UNSET:
            return value
        call = self._call
        fields = self._needs.get(name)
        if name == "tool":
            value = call.tool
        elif name == "side_effect":
            value = self._side_effect
        elif name == "args":
            value = _project(call.args, fields)
        elif name == "history":
            history = call.history
            if isinstance(history, TrimmedHistory) and history.dropped:
                # Only a condition proctor cannot rewrite reads the raw rows (a macro naming its variable
                # `history`): the rows kept are not the whole run, and a window nobody wrote fails open.
                raise ValueError(f"this condition reads the raw history, whose first {history.dropped} calls were "
                                 "dropped: rename the macro variable called 'history' (or write history.last(N))")
            if fields is None:
                value = [h.as_dict() for h in call.history]
            else:  # only the entry fields the conditions read
                kept = [f for f in fields if f in _ENTRY_FIELDS]
                value = [{f: _entry_field(h, f) for f in kept} for h in call.history]
        elif name == "run":
            value = _project(call.run.as_dict(), fields)
        elif name == "usage":
            value = {k: dict(v) if isinstance(v, Mapping) else v for k, v in _project(call.usage, fields).items()}
        elif name == "seen":
            value = list(call.seen)
        elif is_hidden(name):
            return self._fold(name).value_in(self)  # not cached: an error must raise every time
        elif is_probe(name):
            value = self._probe(name)  # raises probes.Unresolved (not cached) when its path does not resolve
        else:
            raise KeyError(name)
        self._cache[name] = value
        return value

    def _probe(self, name: str) -> Any:
        """A provenance call on a path of `args`, answered as CEL would have it from the function."""
        probe = probe_named(name)
        value = probe.argument(self._call.args)
        index = self._call.provenance
        if probe.function == "from_user":
            return False if index is None else index.from_user(value)
        if index is None:
            return boxed(())
        return boxed(index.sources_of(value) if probe.function == "provenance" else index.text_sources_of(value))

    @property
    def call(self) -> Call:
        """The call being decided."""
        return self._call

    def _fold(self, name: str) -> Fold:
        """The fold of a hidden history pipeline: the run's incremental one, or one over a plain list."""
        fold = self._folds.get(name)
        if fold is None:
            pipeline = pipeline_named(name)
            history = self._call.history
            fold = (history.aggregate(pipeline) if isinstance(history, TrimmedHistory)
                    else fold_list(pipeline, (h.as_dict() for h in history)))
            self._folds[name] = fold
        return fold

    def __iter__(self) -> Iterator[str]:
        return iter(("tool", "side_effect", "args", "history", "run", "usage", "seen"))

    def __len__(self) -> int:
        return 7


def _project(value: Mapping[str, Any], fields: frozenset[str] | None) -> dict[str, Any]:
    """`value` as a dict, keeping only `fields` (all when None); absent keys stay absent."""
    if fields is None:
        return dict(value)
    return {k: value[k] for k in fields if k in value}


def _entry_field(entry: HistoryEntry, name: str) -> Any:
    value = getattr(entry, name, None)
    if name == "labels":
        return list(value or ())
    return dict(value) if name == "args" and value is not None else value
