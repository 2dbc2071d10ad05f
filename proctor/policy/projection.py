"""Which parts of each CEL variable a condition can read, so only those are converted.

Handing a Python value to CEL costs about a microsecond per string and per map, so
converting a whole `history` (every earlier call with its arguments) for a condition
that only reads ``h.tool`` would dominate a decision. This module finds, from the
source, the fields a condition selects:

- ``args.to`` / ``args['to']`` -> `args` needs only ``to`` (same for `run`, `usage`);
- ``history.exists(h, h.tool == 'x')`` -> each history entry needs only ``tool``
  (for the macros all/exists/exists_one/map, whose result holds no whole entry);
- ``size(history)`` needs no field at all.

Any other use of a variable (passed whole, ``'k' in args``, ``history.filter(...)``,
a bound name used bare…) means the whole value: the analysis only narrows when it is
sure, so a projected value always gives the same result as the full one. String
literals are scanned too; that can only widen what is kept, never narrow it.
"""

from __future__ import annotations

import re

__all__ = ["Needs", "merge_needs", "needs_of", "selected_fields", "selected_subfields"]

#: For each variable, the fields read (None: the whole value).
Needs = dict[str, "frozenset[str] | None"]

_FIELD = re.compile(r"\s*(?:\.\s*([A-Za-z_]\w*)\b(?!\s*\()|\[\s*(?:'([^'\\]*)'|\"([^\"\\]*)\")\s*\])")
_ENTRY_MACRO = re.compile(r"\s*\.\s*(?:all|exists|exists_one|map)\s*\(\s*([A-Za-z_]\w*)\s*,")
_SIZE_BEFORE = re.compile(r"size\s*\(\s*$")
_SIZE_AFTER = re.compile(r"\s*\)|\s*\.\s*size\s*\(\s*\)")


def _occurrences(source: str, name: str) -> list[re.Match[str]]:
    return list(re.finditer(rf"(?<![\w.]){re.escape(name)}\b", source))


def _selected(source: str, name: str, skip: frozenset[int] = frozenset()) -> frozenset[str] | None:
    """Fields selected from `name` when every use is ``name.field`` or ``name['field']``; else None."""
    fields: set[str] = set()
    for found in _occurrences(source, name):
        if found.start() in skip:
            continue
        selection = _FIELD.match(source, found.end())
        if selection is None:
            return None
        fields.add(next(g for g in selection.groups() if g is not None))
    return frozenset(fields)


def selected_fields(source: str, name: str) -> frozenset[str] | None:
    """The fields `source` selects from `name` when every use is a selection; else None."""
    return _selected(source, name)


def selected_subfields(source: str, name: str) -> frozenset[str] | None:
    """The fields `source` selects one level down in `name` (``usage.b.calls``, ``usage['b']['calls']`` select
    ``calls``) when every use of `name` is such a selection of a selection; else None (a field reached any other
    way: a computed key, a macro over the fields, a value passed whole)."""
    fields: set[str] = set()
    for found in _occurrences(source, name):
        first = _FIELD.match(source, found.end())
        second = _FIELD.match(source, first.end()) if first is not None else None
        if second is None:
            return None
        fields.add(next(g for g in second.groups() if g is not None))
    return frozenset(fields)


def _history(source: str) -> frozenset[str] | None:
    fields: set[str] = set()
    for found in _occurrences(source, "history"):
        macro = _ENTRY_MACRO.match(source, found.end())
        if macro is None:
            if _SIZE_BEFORE.search(source, 0, found.start()) and _SIZE_AFTER.match(source, found.end()):
                continue
            if source.startswith(".size()", found.end()):
                continue
            return None
        # The bound name: every other use of it must select a field of the entry.
        entry = _selected(source, macro.group(1), frozenset({macro.start(1)}))
        if entry is None:
            return None
        fields |= entry
    return frozenset(fields)


def needs_of(source: str, variables: tuple[str, ...]) -> Needs:
    """What `source` reads of each variable it references."""
    needs: Needs = {}
    for name in variables:
        if name in ("tool", "side_effect"):
            needs[name] = None
        elif name == "history":
            needs[name] = _history(source)
        else:
            needs[name] = _selected(source, name)
    return needs


def merge_needs(all_needs: list[Needs]) -> Needs:
    """The union of several conditions' needs (None wins: the whole value)."""
    merged: Needs = {}
    for needs in all_needs:
        for name, fields in needs.items():
            if name in merged and merged[name] is None:
                continue
            if fields is None or name not in merged:
                merged[name] = fields
            else:
                merged[name] = (merged[name] or frozenset()) | fields
    return merged
