"""The one way untrusted text reaches a terminal, and what the approval panel marks in it.

Program output, tool results, errors, arguments, audit records: any of it may have
been written by a model or by whoever a tool read from. Put on a terminal as is, an
``ESC [6A ESC [J`` erases the lines above it (the calls table), a bidi override
reorders what the human reads, and an invisible character hides inside a name.
`terminal_safe` is the single escaping function proctor's terminal output goes
through (`proctor run`, `proctor demo`, `audit show`/`tail`/`verify`, `policy
explain`/`test`, console logs, the approval panel):

- control characters (C0 including ESC, DEL, C1 including the one-byte CSI ``\\x9b``),
  format characters (bidi overrides and isolates, zero-width characters, the BOM,
  soft hyphen), line and paragraph separators, private-use and surrogate code points,
  unassigned code points, and every *default-ignorable* code point (Hangul fillers
  such as U+3164, the combining grapheme joiner U+034F, variation selectors, tag
  characters) become visible escapes: ``\\x1b``, ``\\u202e``, ``\\U000e0041``;
- a backslash is left as is (the output is for reading, not for parsing back).

`look_alikes` finds what can make one string pass for another although every
character is visible — a Cyrillic ``\\u0435`` in ``bob@\\u0435xample.com``, a fullwidth ``\\uff41``, a
no-break space — and `marked_text` renders a string for the approval panel with
those characters highlighted and named. Every rendering of marked text — the console
panel (`marked_text`), the inbox's pages (`marked_html`), the plain text of `proctor
approvals show` and the inbox API's display fields (`marked_plain`) — is made from
`marked_segments`, so each marks the same characters the same way.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["LookAlike", "Segment", "is_invisible", "look_alikes", "marked_html", "marked_plain", "marked_segments",
           "marked_text", "terminal_safe", "text_safe"]

_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})

# Default_Ignorable_Code_Point (Unicode DerivedCoreProperties) that are not in the
# categories above, plus blank-looking letters: rendered as nothing or as blank space.
_IGNORABLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x034F, 0x034F),    # COMBINING GRAPHEME JOINER
    (0x115F, 0x1160),    # HANGUL CHOSEONG / JUNGSEONG FILLER
    (0x17B4, 0x17B5),    # KHMER VOWEL INHERENT AQ / AA
    (0x180B, 0x180F),    # MONGOLIAN FREE VARIATION SELECTORS, VOWEL SEPARATOR
    (0x2800, 0x2800),    # BRAILLE PATTERN BLANK
    (0x3164, 0x3164),    # HANGUL FILLER
    (0xFE00, 0xFE0F),    # VARIATION SELECTORS
    (0xFFA0, 0xFFA0),    # HALFWIDTH HANGUL FILLER
    (0x1D173, 0x1D17A),  # MUSICAL SYMBOL BEGIN/END formatting
    (0xE0000, 0xE0FFF),  # TAGS, VARIATION SELECTORS SUPPLEMENT
)


def is_invisible(ch: str) -> bool:
    """Whether `ch` is escaped by `terminal_safe`: it controls the terminal, or shows as nothing."""
    if unicodedata.category(ch) in _ESCAPED_CATEGORIES:
        return True
    code = ord(ch)
    return any(lo <= code <= hi for lo, hi in _IGNORABLE_RANGES)


def _escape(ch: str) -> str:
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def terminal_safe(value: object, *, keep_newlines: bool = False, keep_tabs: bool = False) -> str:
    """`value` (made a str) with every character that could drive the terminal or hide itself
    replaced by a visible escape. `keep_newlines` / `keep_tabs` keep ``\\n`` / ``\\t`` as they are."""
    text = value if isinstance(value, str) else str(value)
    if text.isascii():  # the common case, with kept newlines and tabs too: nothing to do (decided in C, not per char)
        probe = text.replace("\n", "") if keep_newlines else text
        if (probe.replace("\t", "") if keep_tabs else probe).isprintable():
            return text
    out: list[str] = []
    for ch in text:
        if (ch == "\n" and keep_newlines) or (ch == "\t" and keep_tabs):
            out.append(ch)
        elif ch.isascii() and ch.isprintable():
            out.append(ch)
        elif is_invisible(ch):
            out.append(_escape(ch))
        else:
            out.append(ch)
    return "".join(out)


@dataclass(frozen=True, slots=True)
class LookAlike:
    """A character that can make text pass for other text: where it is and what it is."""

    index: int  # in the original string
    char: str
    kind: str  # "invisible" (escaped) or "confusable" (visible, but looks like something else)
    name: str

    @property
    def label(self) -> str:
        return f"U+{ord(self.char):04X} {self.name}"


_CATEGORY_NAMES = {"Cc": "CONTROL CHARACTER", "Cs": "SURROGATE", "Co": "PRIVATE USE CHARACTER",
                   "Cn": "UNASSIGNED CODE POINT"}


def text_safe(value: object) -> str:
    """`terminal_safe` for text whose layout is its own (a description, a program's output, an error a server
    wrote): newlines and tabs kept, every other character that could drive a terminal or hide itself escaped."""
    return terminal_safe(value, keep_newlines=True, keep_tabs=True)


def _name(ch: str) -> str:
    return unicodedata.name(ch, "") or _CATEGORY_NAMES.get(unicodedata.category(ch), "UNNAMED CHARACTER")


def _confusable(ch: str, ascii_word: bool) -> bool:
    """A visible non-ASCII character that may be read as another one."""
    if ch.isascii():
        return False
    category = unicodedata.category(ch)
    if category == "Zs":  # no-break, en, em, ideographic … spaces: look like " "
        return True
    folded = unicodedata.normalize("NFKC", ch)
    if folded != ch and folded.isascii():  # fullwidth, mathematical letters, ligatures
        return True
    if category[0] == "M":  # a combining mark over an ASCII word changes a letter subtly
        return ascii_word
    # A letter or digit of another script in a word that also has ASCII letters: "\\u0435xample"
    # (Cyrillic). Accented Latin letters ("café", "José") are their own letters, not marked.
    return ascii_word and category[0] in ("L", "N") and not _name(ch).startswith("LATIN ")


def look_alikes(text: str) -> list[LookAlike]:
    """Every invisible character and every character that may pass for another in `text`.

    Confusable means: a non-Latin letter or digit, or a combining mark, inside a word (a
    run of characters between spaces) that also holds ASCII letters — mixed scripts, as in
    ``bob@\\u0435xample.com`` with a Cyrillic ``\\u0435``; any character whose compatibility form is
    ASCII (fullwidth and mathematical letters); any space other than U+0020. A word
    wholly in another script (``прив\\u0435т``) is not marked.
    """
    found: list[LookAlike] = []
    if text.isascii() and text.isprintable():
        return found
    start = 0
    for word in text.split(" "):
        ascii_word = any(c.isascii() and c.isalpha() for c in word)
        for offset, ch in enumerate(word):
            if ch in "\n\t":
                continue
            if is_invisible(ch):
                found.append(LookAlike(start + offset, ch, "invisible", _name(ch)))
            elif _confusable(ch, ascii_word):
                found.append(LookAlike(start + offset, ch, "confusable", _name(ch)))
        start += len(word) + 1
    return found


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of marked text: `text` as it may be shown (escaped), and the mark on it, if any."""

    text: str
    mark: LookAlike | None = None


def marked_segments(value: object, *, keep_newlines: bool = False) -> list[Segment]:
    """`value` cut into plain runs (escaped by `terminal_safe`) and marked characters: each invisible
    one as its escape (``\\u202e``), each confusable one as itself, with its `LookAlike`.

    The one place the marks are decided: the console panel (`marked_text`), the inbox's pages
    (`marked_html`) and the plain text of `proctor approvals show` and the API (`marked_plain`)
    all render these segments, so they mark exactly the same characters.
    """
    text = value if isinstance(value, str) else str(value)
    marks = {m.index: m for m in look_alikes(text)}
    if not marks:
        return [Segment(terminal_safe(text, keep_newlines=keep_newlines))] if text else []
    out: list[Segment] = []
    plain: list[str] = []
    for i, ch in enumerate(text):
        mark = marks.get(i)
        if mark is None:
            plain.append(ch)
            continue
        if plain:
            out.append(Segment(terminal_safe("".join(plain), keep_newlines=keep_newlines)))
            plain = []
        out.append(Segment(_escape(ch) if mark.kind == "invisible" else ch, mark))
    if plain:
        out.append(Segment(terminal_safe("".join(plain), keep_newlines=keep_newlines)))
    return out


def marked_plain(value: object, *, keep_newlines: bool = False) -> str:
    """`value` as plain text with its marks spelled out: invisible characters as escapes
    (``\\u202e``), each confusable one followed by its code point (``\u0435⟨U+0435⟩``)."""
    return "".join(seg.text if seg.mark is None or seg.mark.kind == "invisible"
                   else f"{seg.text}⟨U+{ord(seg.mark.char):04X}⟩" for seg in marked_segments(
                       value, keep_newlines=keep_newlines))


def marked_html(value: object) -> str:
    """`value` as HTML text (never markup of its own): escaped, each invisible character shown as its
    escape and each confusable one highlighted, both in a ``<mark>`` naming the character. Newlines
    are kept (the page shows them in ``<pre>``). Returns HTML to insert in element content, never
    in an attribute."""
    from html import escape

    parts: list[str] = []
    for seg in marked_segments(value, keep_newlines=True):
        if seg.mark is None:
            parts.append(escape(seg.text, quote=True))
            continue
        label = escape(seg.mark.label, quote=True)
        if seg.mark.kind == "invisible":
            parts.append(f'<mark class="invisible" title="{label}">{escape(seg.text)}</mark>')
        else:
            parts.append(f'<mark class="confusable" title="{label}">{escape(seg.text)}'
                         f'<span class="cp">U+{ord(seg.mark.char):04X}</span></mark>')
    return "".join(parts)


def marked_text(value: object, *, keep_newlines: bool = False, style: str = "") -> Text:
    """`value` as a rich `Text` for the approval panel: escaped as by `terminal_safe`, each
    invisible character's escape in reverse red, each confusable character highlighted and
    followed by its code point (``\u0435⟨U+0435⟩``), never parsed as markup."""
    from rich.text import Text

    out = Text(style=style)
    for seg in marked_segments(value, keep_newlines=keep_newlines):
        if seg.mark is None:
            out.append(seg.text)
        elif seg.mark.kind == "invisible":
            out.append(seg.text, style="bold reverse red")
        else:
            out.append(seg.text, style="bold reverse yellow")
            out.append(f"⟨U+{ord(seg.mark.char):04X}⟩", style="bold yellow")
    return out
