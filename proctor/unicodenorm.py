"""NFKC that stays linear on hostile text: the Stream-Safe Text Format (UAX #15) first.

CPython's `unicodedata.normalize` puts the combining marks after a base character in
canonical order with an insertion sort, holding the GIL: a run of n marks out of order
costs O(n²). ``"a" + "\\u0301" * 500_000 + "\\u0323" * 500_000`` (2 MB) takes minutes of
CPU, so one argument a program sends to a rule using ``normalize()``, or one tool result
the provenance index folds, would freeze every run of the host process. No text a person
writes has more than a handful of marks on one character, so, as UAX #15's stream-safe
format does, a U+034F COMBINING GRAPHEME JOINER (a starter, invisible) is put after every
30 consecutive non-starters before normalising: the sort then never sees more than 30.
Text without such a run (all real text) is normalised exactly as before.
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["MAX_NON_STARTERS", "nfkc", "non_starters", "stream_safe"]

#: The longest run of non-starters (combining class > 0) left as it is (UAX #15's limit).
MAX_NON_STARTERS = 30
_CGJ = "\u034f"


@functools.cache
def _bmp_marks() -> list[int]:
    """The BMP's non-starters. Built on first use: the scan costs milliseconds, and ASCII text never needs it."""
    return [c for c in range(0x10000) if unicodedata.combining(chr(c))]


@functools.cache
def non_starters() -> bytes:
    """The BMP's non-starters as a bitmap (bit ``c & 7`` of byte ``c >> 3``), for `proctor._provtok.visible`."""
    bits = bytearray(0x10000 >> 3)
    for c in _bmp_marks():
        bits[c >> 3] |= 1 << (c & 7)
    return bytes(bits)


@functools.cache
def _suspect_runs() -> re.Pattern[str]:
    """Runs of more than MAX_NON_STARTERS characters that are BMP non-starters or any astral character
    (astral ones are checked one by one: a run of emoji is no run of marks)."""
    ranges: list[tuple[int, int]] = []
    for c in _bmp_marks():
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1] = (ranges[-1][0], c)
        else:
            ranges.append((c, c))
    members = "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)
    # One class: sre makes its BMP part a bitmap (one lookup a character) and keeps the astral range as a tail.
    return re.compile(f"[{members}\U00010000-\U0010ffff]{{{MAX_NON_STARTERS + 1},}}")


def _cut(run: re.Match[str]) -> str:
    text = run.group()
    # Most such runs are astral characters that are no marks (emoji, CJK extensions): their distinct characters are
    # few, and checking those (a set built in C) instead of every character makes 100,000 emoji 6 ms cheaper.
    if not any(unicodedata.combining(ch) for ch in set(text)):
        return text
    out: list[str] = []
    count = 0
    for ch in text:
        if unicodedata.combining(ch):
            if count == MAX_NON_STARTERS:
                out.append(_CGJ)
                count = 0
            count += 1
        else:
            count = 0
        out.append(ch)
    return "".join(out)


def stream_safe(text: str) -> str:
    """`text` with a U+034F after every MAX_NON_STARTERS consecutive non-starters (itself when it has no such run)."""
    if text.isascii():
        return text
    return _suspect_runs().sub(_cut, text)


def nfkc(text: str, *, runs: bool = True) -> str:
    """``unicodedata.normalize("NFKC", text)`` in time linear in the text (see the module docstring).

    ``runs=False``: the caller found no run of more than MAX_NON_STARTERS characters that are BMP non-starters
    or astral in `text` (`proctor._provtok.visible` tells), so `stream_safe` would leave it as it is: skipped.
    """
    if text.isascii():
        return text
    return unicodedata.normalize("NFKC", stream_safe(text) if runs else text)
