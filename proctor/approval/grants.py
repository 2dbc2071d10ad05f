"""Grant patterns: what "approve this tool for the rest of the run when `to=*@partner.org`" admits.

A human writing ``*@partner.org`` means "one mailbox at partner.org". A shell glob
(fnmatch) means far more: ``*`` matches anything, so ``attacker@evil.com, bob@partner.org``,
``attacker@evil.com\\n@partner.org`` and ``attacker@evil.com>@partner.org`` all match.
Arguments are free text written by a model; a grant pattern must not admit what
the human could not have meant. The rules:

- A pattern is literal text with two wildcards. ``*`` matches **one or more** *word
  characters*: ASCII letters, digits and ``. _ + - = % ~`` (but not ``.`` or ``..``
  alone before a ``/`` or the end). It never matches ``@``, ``/``, whitespace, control
  or invisible characters, ``, ; < > " '`` or any other punctuation, nor any non-ASCII
  character. ``**`` also crosses ``/`` (path segments of
  word characters; never an empty, ``.`` or ``..`` segment).
- A value is admitted only if it is a string (or an integer, as its decimal digits)
  matched **whole** by the pattern; lists, mappings, booleans, None and floats never are.
- A value holding whitespace, a control, format or invisible character, or a
  character that can pass for another (`proctor.termsafe.look_alikes`) is never admitted,
  whatever the pattern; nor is a value over 1,024 characters.
- A pattern itself may hold only printable ASCII without whitespace; ``[``, ``]``, ``?``
  and ``\\`` are refused (no classes, no escapes), so what it says is what it admits.

`GrantPattern.parse` checks a pattern, `.admits(value)` decides and `.describe()` says
in words what it admits; `grant_admits` applies a `Grant`; `describe_grant` gives the
lines the console shows before a grant is given (an approval inbox reuses both).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proctor.approval.base import Grant
from proctor.termsafe import look_alikes

__all__ = ["MAX_GRANTED_VALUE", "WORD_CHARS", "GrantPattern", "describe_grant", "grant_admits"]

#: What one ``*`` may match (one or more of these).
WORD_CHARS = "A-Za-z0-9._+\\-=%~"
MAX_GRANTED_VALUE = 1024
_WORD = f"[{WORD_CHARS}]+"
_SEGMENT = f"(?!\\.\\.?(?:/|$)){_WORD}"  # a path segment: word characters, not "." or ".."
_REFUSED_IN_PATTERN = set("[]?\\")


@dataclass(frozen=True)
class GrantPattern:
    """A checked grant pattern; see the module docstring for what it admits."""

    text: str
    regex: re.Pattern[str]

    @classmethod
    def parse(cls, text: str) -> GrantPattern:
        """Check `text`; raise ValueError (one line, fit for a prompt or an HTTP 400) if it is not a pattern."""
        if not text:
            raise ValueError("an empty pattern admits nothing; give a value or omit the argument")
        bad = sorted({c for c in text if not (c.isascii() and c.isprintable()) or c.isspace()})
        if bad:
            raise ValueError(f"pattern {text!r} holds {', '.join(map(repr, bad))}: only printable ASCII "
                             "without spaces is allowed")
        refused = sorted(_REFUSED_IN_PATTERN & set(text))
        if refused:
            raise ValueError(f"pattern {text!r} holds {' '.join(refused)}: only * and ** are wildcards "
                             "(no ?, classes or escapes)")
        if "***" in text:
            raise ValueError(f"pattern {text!r}: use * (within a segment) or ** (across /), not ***")
        parts: list[str] = []
        for token in re.split(r"(\*\*|\*)", text):
            if token == "**":
                parts.append(f"{_SEGMENT}(?:/{_SEGMENT})*")
            elif token == "*":
                parts.append(_SEGMENT)  # so "/data/*" never admits "/data/.."
            elif token:
                parts.append(re.escape(token))
        return cls(text, re.compile("".join(parts)))

    @property
    def literal(self) -> bool:
        return "*" not in self.text

    def admits(self, value: Any) -> bool:
        """Whether `value` (an argument as the tool will get it) is admitted."""
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return False
        text = str(value)
        if len(text) > MAX_GRANTED_VALUE or any(c.isspace() for c in text) or look_alikes(text):
            return False
        return self.regex.fullmatch(text) is not None

    def describe(self) -> str:
        """What the pattern admits, in words."""
        if self.literal:
            return f"exactly {self.text!r}"
        pieces: list[str] = []
        for token in re.split(r"(\*\*|\*)", self.text):
            if token == "**":
                pieces.append("<one or more /-separated segments of word characters>")
            elif token == "*":
                pieces.append("<one or more word characters>")
            elif token:
                pieces.append(repr(token))
        return " then ".join(pieces) + f" (word characters: ASCII letters, digits and {' '.join('._+-=%~')})"


def grant_admits(grant: Grant, tool: str, args: Mapping[str, Any]) -> bool:
    """Whether `grant` covers a call of `tool` with `args`: same tool, and every pattern admits its argument.

    A pattern that does not parse admits nothing (fail closed).
    """
    if grant.tool != tool:
        return False
    for name, text in grant.args.items():
        if name not in args:
            return False
        pattern = _compiled(text)
        if pattern is None:
            return False
        if not pattern.admits(args[name]):
            return False
    return True


@functools.lru_cache(maxsize=256)
def _compiled(text: str) -> GrantPattern | None:
    """`GrantPattern.parse(text)`, cached (a run checks the same few patterns on every call); None if invalid."""
    try:
        return GrantPattern.parse(text)
    except ValueError:
        return None


_PROBES = ("attacker@evil.com, {v}", "attacker@evil.com\n{v}", "attacker@evil.com>{v}", "{v} ", "../{v}")


def describe_grant(grant: Grant, current: Mapping[str, Any] | None = None) -> list[str]:
    """Lines saying what `grant` will admit, for a human to read before it is given.

    With `current` (the arguments of the call being approved) it also says whether this
    call itself is admitted, and shows that the classic smuggling forms built from its
    values are not.
    """
    if not grant.args:
        return [f"every later call of {grant.tool}, with any arguments, for the rest of the run"]
    lines = [f"later calls of {grant.tool} for the rest of the run, when:"]
    for name, text in grant.args.items():
        pattern = GrantPattern.parse(text)
        lines.append(f"  {name}: {pattern.describe()}")
        if current is not None and name in current:
            value = current[name]
            verdict = "admitted" if pattern.admits(value) else "NOT admitted (this grant would not cover it)"
            lines.append(f"    this call's {name}={value!r}: {verdict}")
            if isinstance(value, str) and pattern.admits(value):
                refused = [p.format(v=value) for p in _PROBES if not pattern.admits(p.format(v=value))]
                if refused:
                    lines.append(f"    never e.g. {', '.join(repr(r) for r in refused[:3])}")
    lines.append("  values with spaces, control, invisible or look-alike characters are never admitted")
    return lines
