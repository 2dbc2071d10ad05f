"""Where values came from: a per-run index of what labelled tools returned and of the task.

A policy that calls `provenance(value)` or `from_user(value)` makes the gate keep, for each
run, a `ProvenanceIndex`: the results of every tool the policy gives `labels` (``tools: X:
{labels: [untrusted]}``) are indexed under those labels, and the run's task text under the
label ``user``. A later call's arguments are looked up in it (see docs/policy.md).

What is indexed, from a result (any JSON-like value: strings, numbers, lists, maps, and
the string form of anything else) and from the task:

- every string value (and map key) as a whole, normalised: case-folded, whitespace
  collapsed, trimmed;
- every *token* inside it that looks like an identifier: a run of letters, digits and
  ``. @ / : # + _ - % ~ = ? & ,`` holding a digit or a separator between two word
  characters (it may follow leading separators: ``/etc/passwd``, ``+15551234567``) — e-mail
  addresses, URLs (also without their scheme, without ``www.``, their host, and the host
  without its port or ``www.``), file names, record ids, account numbers, numbers; an IBAN
  written in groups (``DE89 3704 0044 …``) also without its spaces. Trailing sentence
  punctuation and markdown emphasis (``_…_``, ``~…~``) are dropped; numbers lose thousands
  commas and trailing decimal zeros (``1,250.50`` is ``1250.5``). Everything is case-folded
  (non-ASCII text NFKC-normalised first): ``Eve@Evil.example`` and ``eve@evil.example`` are
  the same token;
- numbers (int and float values) in their normalised text form;
- for the task only, every run of one to `TASK_WORDS` whole words, so a name the user
  wrote (``Emma Johnson``) is found as a whole; a number of one or two digits in the task
  (a day, a count) is not indexed on its own: too ambiguous to attribute an id to the user.

A value built from pieces (``'eve' + '@' + 'evil.example'``, a recipient read character by
character, a translated or re-encoded string) is *not* traced: only values that appear as
a whole, or as one of the tokens above, are found.

Nothing is kept in clear: each entry is a 64-bit keyed digest mapped to the labels it was seen
under — SipHash-1-3 of the text's UTF-8 under a 128-bit key drawn for each index (never the audit
key), computed by the C extension `proctor._provtok`, which tokenises, digests and inserts a result
in one call (indexing 100 KB must cost about a millisecond; in Python each token costs an object, a
hash and an insert). Without the extension (no C compiler at install) the same tokens come from the
Python code below and the digest is Python's string hash (SipHash-1-3) of a secret 128-bit prefix
followed by the text, so neither depends on Python's own hash key (``PYTHONHASHSEED``). Without the
key nobody can compute a digest or craft a collision; it is a fingerprint compared only inside this
process, never shown or stored.

Invisible characters (zero-width space and joiners, word joiner, BOM, soft hyphen) are removed
and non-ASCII dashes read as ``-`` before anything else; a token of letter-and-digit groups
joined by dashes, each group holding a digit, seven characters or more without them
(``123-456-789``, ``de89-3704-…``; not a range ``10-12``), is also
indexed without its dashes. A number laid out in groups of ASCII letters and digits (each holding a
digit) across gaps of whitespace and ``- . / ( ) _`` — ``1234 5678 9012``, ``+1 (555) 123-4567``,
``0012.3456.7890``, an IBAN on several lines — is also indexed joined: every run of two or more
consecutive groups of 7 to 34 characters crossing at most one line break, and an IBAN from its first
group (`_grouped`; docs/policy.md says it for users).

Memory is bounded (`ProvenanceLimits`): at most `max_result_chars` characters of one
result and `max_result_tokens` of its entries (each string counting its distinct ones) are
indexed, and at most `max_tokens` entries per run. What a cap leaves out is not lost silently: the labels of the content
that could not be indexed are *added to every later `labels_of` answer* of the run
(provenance then errs towards "may have come from an untrusted tool"), while
`from_user` only ever answers from entries actually indexed — a full index never makes
a value look as if the user had written it. A string whose joined forms would take its result past
`max_joined_forms` (or one per `_JOINED_PER_CHARS` characters of the result: a table of numbers) has
none of them indexed, and its labels are added to the answer for every argument that could be one
(`_joinable`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from proctor.calls import JSONValue
from proctor.unicodenorm import nfkc, non_starters

try:  # the tokeniser and digests in C (setup.py); without a compiler the same tokens come from Python below
    from proctor import _provtok as _native

    if not hasattr(_native, "visible"):  # built from an older _provtok.c (a checkout updated, not rebuilt): its
        raise ImportError("stale proctor._provtok")  # tokens differ; the Python path, and a failing build test
except ImportError:  # pragma: no cover - an install that could not build the extension
    _native = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from proctor._provtok import Digests

__all__ = [
    "PHRASE_WORDS",
    "TASK_WORDS",
    "USER",
    "FieldLabels",
    "ProvenanceIndex",
    "ProvenanceLimits",
    "ResultLabeller",
    "ResultPlan",
    "glued_forms",
    "normalize_whole",
    "phrase_runs",
    "tokens",
]

#: The label of the run's task text (`Gate.start_run(task=…)`).
USER = "user"
#: Longest run of whole words of the task indexed as one entry.
TASK_WORDS = 8
#: Runs of two to this many words of a result are indexed when its tool opts in (`ResultPlan.phrases`); a longer
#: argument is traced to it when one of its runs of this many words is.
PHRASE_WORDS = 4

_SEPARATORS = ".@/:#+_-%~=?&,"
# A token starts at a word character and runs over word characters and separators; the
# lookahead keeps only those holding a digit or a separator between two word characters
# (plain words are not identifiers). It may start after leading separators (``/etc/passwd``,
# ``+15551234567``, ``//host/x``), never inside a word. Matching stays in the regex engine.
_TOKEN = re.compile(
    r"(?<!\w)"
    r"(?=[\w.@/:#+%~=?&,-]*?(?:\d|[^\W_][.@/:#+_%~=?&-]+[^\W_]))"
    r"\w[\w.@/:#+%~=?&,-]*"
)
_IBAN = re.compile(r"(?<!\w)[a-z]{2}\d{2}(?: [a-z0-9]{4}){2,7}(?: [a-z0-9]{1,4})?(?!\w)")
_TRAILING = ".,:;!?/#-=&_~"
_LEADING = "_~"  # markdown emphasis and strike-through around a token: _eve@evil.example_
_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")
# Characters that end a token besides whitespace (quotes, brackets, …): turned into spaces before splitting.
_DELIMITERS = str.maketrans(dict.fromkeys("\"'`<>()[]{}|;!*^\\", "\n"))
# A token that is its own only form: no trailing punctuation, no URL, no key=value, not a number with
# separators, no comma-separated list.
_SIMPLE = re.compile(r"^(?!www\.)(?!_)(?!\d+\.\d*0$)[\w.@+%~#-]*[^\W_]$", re.MULTILINE)
_PORT = re.compile(r":\d+$")
#: Characters without which an ASCII text holds no token (a token holds a digit or one of these separators).
_TOKEN_CHARS = "0123456789.@/:#+%~=?&-_"
_IBAN_HEAD = re.compile(r"\n[a-z]{2}\d{2}\n")
# A candidate line that is its own only token (see `_analyze_text`): bitmap character classes, a literal
# newline first (the engine skips to each line), no lookbehind.
_CLEAN = re.compile(r"\n(?!www\.)(?!\d+\.\d*0\n)(?=[a-z]*[0-9.@+%#-])([a-z0-9](?:[a-z0-9.@+%#-]*[a-z0-9])?)(?=\n)")
_URL_LINE = re.compile(r"\n([a-z][a-z0-9+.-]*://(www\.)?([a-z0-9-]+(?:\.[a-z0-9-]+)*)((?:/[a-z0-9._~%/-]*[a-z0-9])?)"
                       r"((?:\?[a-z0-9]+=[a-z0-9]+(?:&[a-z0-9]+=[a-z0-9]+)*)?))(?<=[a-z0-9])(?=\n)")
_NUMBER_LINE = re.compile(r"\n(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d*0)(?=\n)")
_TIME_LINE = re.compile(r"\n((\d+):(\d+))(?=\n)")
_DASHED = re.compile(r"\n((?:[a-z]*\d[a-z0-9]*-)+[a-z]*\d[a-z0-9]*)(?=\n)")
# Characters a reader does not see inside a token (zero-width space/joiners, word joiner, BOM, soft hyphen):
# removed before anything else, so they cannot split a token.
# Dashes other than the hyphen-minus (a figure dash, an en dash, a minus sign…) read as it; the ideographic full
# stops (U+3002, halfwidth U+FF61) read as ".", as IDNA (UTS #46) reads them between the labels of a domain name:
# a browser or HTTP client goes to evil.example for "evil。example".
_INVISIBLE: dict[int, str | None] = {**dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff\u00ad")),
                                     **dict.fromkeys(map(ord, "\u2010\u2011\u2012\u2013\u2014\u2212"), "-"),
                                     **dict.fromkeys(map(ord, "\u3002\uff61"), ".")}
_PIECES = re.compile(r"[=&?:]")
_WORD = re.compile(r"\w+")
#: Punctuation of prose that `from_user` sets aside between a value's words (`ProvenanceIndex._words_from`):
#: ``Paris.``, ``O'Neil``, ``Follow up: budget, staffing``; any other mark keeps a value from being read as words.
_PROSE_MARKS = ".,:!?'\"()\u2018\u2019\u201c\u201d"
_NOT_PROSE = re.compile(r"[^\w\s" + re.escape(_PROSE_MARKS) + "]")


def _fold(text: str) -> str:
    """Case-folded, and for non-ASCII text without zero-width characters and soft hyphens and NFKC-normalised
    first (a fullwidth at sign is ``@``)."""
    if text.isascii():
        return text.casefold()
    if _native is not None:  # one pass in C: str.translate with a dict costs ~35 ns a character (3.5 ms for 100 KB)
        text, runs = _native.visible(text, non_starters())
        return nfkc(text, runs=runs).casefold()
    return nfkc(text.translate(_INVISIBLE)).casefold()  # linear even on a flood of combining marks


def normalize_whole(text: str) -> str:
    """A string as indexed whole: case-folded (NFKC), whitespace collapsed and trimmed."""
    folded = _fold(text)
    words = folded.split()
    return folded if len(words) == 1 and words[0] == folded else " ".join(words)


def _number(text: str) -> str:
    """``1,250.50`` -> ``1250.5``; ``007`` stays ``007`` (an account number keeps its zeros)."""
    text = text.replace(",", "")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def _token_forms(token: str) -> Iterator[str]:
    token = token.rstrip(_TRAILING).lstrip(_LEADING)
    if not token:
        return
    if _NUMBER.fullmatch(token):
        yield _number(token)
        return
    if "," in token:  # a list written without spaces: each part is its own token
        for part in token.split(","):
            yield from _token_forms(part)
        return
    yield token
    if _PIECES.search(token.replace("://", "")):  # key=value, a query string, mailto:x: each piece too
        for piece in _PIECES.split(token.replace("://", "\0")):
            if piece and piece != token and _TOKEN.fullmatch(piece):
                yield from _token_forms(piece.replace("\0", "://"))
    scheme = token.find("://")
    rest = token[scheme + 3 :] if scheme > 0 else token if token.startswith("www.") else None
    if rest:
        yield rest
        if rest.startswith("www.") and len(rest) > 4:  # the address without www. (and its path)
            yield rest[4:]
        host = rest.split("/", 1)[0].split("?", 1)[0]
        if host and host != rest:
            yield host
        bare = _PORT.sub("", host)  # evil.example:443 is evil.example
        if bare != host:
            yield bare
        if bare.startswith("www.") and len(bare) > 4:
            yield bare[4:]


def tokens(text: str) -> set[str]:
    """The identifier-like tokens of `text`, normalised as they are indexed (see the module docstring)."""
    return set(_analyze(text)[1])


@functools.lru_cache(maxsize=4096)
def _analyze_short(text: str) -> tuple[str, frozenset[str]]:
    """`_analyze` of a short argument asked about, remembered (a decision often asks about the same value
    twice). Only lookups use it: what results hold is never cached in clear."""
    whole, found = _analyze_text(text)
    return whole, frozenset(found)


def _analyze(text: str) -> tuple[str, set[str] | frozenset[str]]:
    """`text` normalised as a whole (`normalize_whole`) and its tokens, from one case-fold and split."""
    return _analyze_short(text) if len(text) <= 256 else _analyze_text(text)


def _analyze_text(text: str) -> tuple[str, set[str]]:
    """`text` normalised as a whole and its tokens: in C when the extension built, else in Python (the same),
    and the hosts and addresses a sentence was glued to (`glued_forms`)."""
    native = _native
    whole, found = native.analyze(_fold(text)) if native is not None else _analyze_text_python(text)
    if _GLUE_HINT.search(text) is not None:
        found.update(glued_forms(text))
    return whole, found


#: A full stop and a capital: where a sentence may be glued to a host (a literal first: the engine skips to each
#: full stop, ~30 µs for 100 KB, where a class first costs ~0.9 ms).
_GLUE_HINT = re.compile(r"\.[A-Z]")
# A token ending in a host (a lower-case label of two letters or more after a dot: ``our-company.com``,
# ``x.com.au``), or in a URL's path after one, glued by a full stop to a capitalised word that is not itself
# part of a name (``.They``, ``.Thanks``, ``.I``): "www.our-company.com.They will…" as a prompt or a mail
# writes it without a space.
_GLUED = re.compile(r"(?<![\w.@/:#+%~=?&,-])([\w@/:#+%~=?&-][\w.@/:#+%~=?&,-]*?[a-z0-9]\.[a-z]{2,63}"
                    r"(?:[/?#][\w.@/:#+%~=?&,-]*?[a-z0-9/])?)\.[A-Z][a-z]*(?![\w.@/:#+%~=?&-])")


def glued_forms(text: str) -> set[str]:
    """The forms of each host or address of `text` followed, without a space, by the next sentence
    (``www.our-company.com.They`` gives ``www.our-company.com`` and ``our-company.com``), as both tokenisers
    give them for the host alone.

    Tokens are read from case-folded text, where ``com.They`` and ``com.au`` look alike; the capital of the
    original text tells them apart, so this runs on the text before folding and adds to the tokens (the glued
    spelling stays indexed too: a value that copies it is still traced). A lower-case word after the dot
    (``example.com.au``) is a label of the host and is never split off.
    """
    out: set[str] = set()
    native = _native
    for host in _GLUED.findall(text):
        whole, found = native.analyze(_fold(host)) if native is not None else _analyze_text_python(host)
        out.add(whole)
        out.update(found)
    return out


def _analyze_text_python(text: str) -> tuple[str, set[str]]:
    """`_analyze_text` in Python: the fallback without the C extension, and the reference it is tested against."""
    return _analyze_folded_python(_fold(text))


def _analyze_folded_python(folded: str) -> tuple[str, set[str]]:
    """`_analyze_text_python` of a text already folded (`_fold`)."""
    whole, out, _ = _forms_python(folded, None)
    return whole, out


def _forms_python(folded: str, joined_cap: int | None) -> tuple[str, set[str], int]:
    """`_analyze_folded_python`, and how many distinct joined forms (`_grouped`) the text gave: more than
    `joined_cap` (counted no further) and none of them is in the set."""
    if len(folded) > 256 and folded.isascii() and not any(c in folded for c in _TOKEN_CHARS):
        # No digit and no separator: prose without a single token (each scan is a fast search in C).
        if folded.isprintable() and "  " not in folded and folded[:1] != " " and folded[-1:] != " ":
            return folded, set(), 0  # already its whole form: one space between words
        return " ".join(folded.split()), set(), 0
    words = folded.split()
    if len(words) == 1:  # one word (an address, an id, a name): the common argument
        word = words[0]
        if word.isalpha():
            return word, set(), 0
        if _TOKEN.fullmatch(word) and _SIMPLE.fullmatch(word):
            forms = _dashless({word}) if "-" in word else {word}
            compacted = _grouped(word, joined_cap)  # 0012.3456.7890, 1234-5678-9012: also joined
            cut = joined_cap is not None and len(compacted) > joined_cap
            return word, forms if cut else forms | compacted, len(compacted)
    whole = " ".join(words) if len(words) != 1 or folded != words[0] else folded
    # Work in the regex engine and in C as much as possible (a 100 KB result must index in about a
    # millisecond): the distinct non-alphabetic words, joined one per line; those that are their own
    # only token (ASCII letters and digits joined by . @ + % # -: addresses, ids, plain numbers) taken
    # in one pass; the others (URLs, key=value, numbers with separators, punctuation around a word,
    # non-ASCII text) tokenised and normalised as before.
    candidates = [word for word in set(words) if not word.isalpha()]
    if not candidates:
        return whole, set(), 0
    blob = "\n" + "\n".join(candidates).translate(_DELIMITERS) + "\n"
    if folded.isascii():
        out = set(_CLEAN.findall(blob))
        rest = [line for line in set(blob.split("\n")).difference(out) if line and not line.isalpha()]
    else:
        out, rest = set(), [blob]
    if len(rest) > 8:  # plain URLs, numbers with separators and times, in bulk (the forms `_token_forms` gives)
        rest = _common_forms(rest, out)
    iban_head = _IBAN_HEAD.search(blob) is not None
    if rest:
        found = _TOKEN.findall("\n".join(rest))
        joined = "\n".join(found)
        iban_head = iban_head or _IBAN_HEAD.search(f"\n{joined}\n") is not None
        simple = _SIMPLE.findall(joined)
        out.update(simple)
        for token in set(found).difference(simple):
            out.update(_token_forms(token))
    if "-" in blob:  # an account number or IBAN written with dashes: also without them
        out = _dashless(out)
    compacted = _grouped(folded, joined_cap)  # a number laid out in groups (spaces, dots, brackets…): also joined
    cut = joined_cap is not None and len(compacted) > joined_cap
    if not cut:
        out.update(compacted)
    if iban_head:  # an IBAN written in groups of four: also indexed without its spaces
        for iban in _IBAN.findall(folded):
            out.add(iban.replace(" ", ""))
    return whole, out, len(compacted)


def _common_forms(lines: list[str], out: set[str]) -> list[str]:
    """Add to `out` the forms of the `lines` that are plain URLs (``https://www.x.example/a/b?id=7``: also
    without the scheme, without ``www.``, the host, the query's pieces), numbers with thousands commas or
    trailing decimal zeros, or times (``10:45``: also ``10`` and ``45``), exactly as `_token_forms` gives
    them; return the other lines."""
    blob = "\n" + "\n".join(lines) + "\n"
    done: set[str] = set()
    for url, www, host, path, query in _URL_LINE.findall(blob):
        done.add(url)
        out.add(url)
        out.add(www + host + path + query)
        if www:
            out.add(host + path + query)
            out.add(host)
        if path or query:
            out.add(www + host)
        if query:  # each key and value of the query string that is a token (holds a digit)
            out.update(piece for piece in re.split("[?=&]", query) if piece and not piece.isalpha())
    for number in _NUMBER_LINE.findall(blob):
        done.add(number)
        out.add(_number(number))
    for time_, hours, minutes in _TIME_LINE.findall(blob):
        done.add(time_)
        out.update((time_, hours, minutes))
    return [line for line in lines if line not in done] if done else lines


#: Shortest dashless form of a dashed token that is indexed (``555-0100`` is; ``10-12`` is not).
_DASHLESS_MIN = 7

#: Shortest and longest compact form of a number laid out in groups that is indexed (`_grouped`): seven
#: characters as for dashes (not a range, a time or a short date), 34 the longest IBAN.
_GROUPED_MIN = 7
_GROUPED_MAX = 34
#: At least one joined form per this many characters of a string is indexed (`ProvenanceLimits.max_joined_forms`):
#: a page gives one per ~40 (2,523 for 100 KB of the bench's "page"), a table of numbers one per ~0.6.
_JOINED_PER_CHARS = 8
#: Most groups joined outside an IBAN: a number written one digit at a time is joined up to 12 digits, and a
#: result of tiny groups without end ("1 2 1 2 …") gives at most 11 joined forms a group, not 28.
_GROUPED_GROUPS = 12
# A number laid out in groups (`_grouped`): groups of ASCII letters and digits, each holding a digit — or four
# letters right after an IBAN's first group (the bank code of GB29 NWBK …) — not inside a longer word, joined by
# runs of whitespace and ``- . / ( ) _``. Two groups at least; [0-9], not \d: ASCII digits only.
_GROUP_SEP = r"[\s./()_-]+"
_GROUP_HEAD = r"[a-z]{2}[0-9]{2}" + _GROUP_SEP + r"[a-z]{4}(?![^\W_])"
_GROUP_DIGITS = r"[a-z]*[0-9][a-z0-9]*(?![^\W_])"
_GROUP_UNIT = f"(?:{_GROUP_HEAD}|{_GROUP_DIGITS})"
_GROUPED = re.compile(f"(?<![^\\W_])(?:{_GROUP_HEAD}(?:{_GROUP_SEP}{_GROUP_UNIT})*"
                      f"|{_GROUP_DIGITS}(?:{_GROUP_SEP}{_GROUP_UNIT})+)")
_GROUP = re.compile(r"[a-z0-9]+")
_GROUP_GAP = re.compile(r"[^a-z0-9]+")
_IBAN_FIRST = re.compile(r"[a-z]{2}[0-9]{2}")
#: Characters that end a line (str.splitlines()): a gap holding one is a line break between groups.
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _grouped(folded: str, limit: int | None = None) -> set[str]:
    """The compact forms of the numbers `folded` lays out in groups: ``1234 5678 9012``, ``+1 (555) 123-4567``,
    ``0012.3456.7890``, ``gb29\tnwbk\t6016…`` give ``123456789012``, ``15551234567`` (and ``5551234567``, …),
    ``001234567890``, ``gb29nwbk6016…``.

    In a sequence of groups (see `_GROUPED`), every run of two to `_GROUPED_GROUPS` consecutive groups whose joined
    form has `_GROUPED_MIN` to `_GROUPED_MAX` characters and which crosses at most one line break is indexed joined (so
    the account inside ``Ref 7 1234 5678 9012`` is found, and a number wrapped onto the next line; a column of
    a table is not joined line after line). A group of two letters and two digits starts an IBAN: the sequence
    is cut before it, and from an IBAN only its prefixes of two groups or more (its groups laid out on any
    number of lines) are indexed.
    """
    out: set[str] = set()
    for match in _GROUPED.finditer(folded):
        chain = match.group()
        groups = _GROUP.findall(chain)
        breaks = [not _LINE_BREAKS.isdisjoint(gap) for gap in _GROUP_GAP.findall(chain)]
        start = 0
        for end in range(1, len(groups) + 1):
            if end == len(groups) or _IBAN_FIRST.fullmatch(groups[end]):
                _grouped_run(groups[start:end], breaks[start : end - 1], out)
                start = end
        if limit is not None and len(out) > limit:  # more than the caller keeps: no need to find the rest
            break
    return out


def _joinable(text: str) -> bool:
    """Whether `text` (folded) could be a joined form of a number laid out in groups: 7 to 34 ASCII letters and
    digits, one a digit at least. An argument looked up by such a text gets the labels of results whose joined
    forms were too many to index (`ProvenanceIndex.numbers_overflowed`)."""
    return _GROUPED_MIN <= len(text) <= _GROUPED_MAX and text.isascii() and text.isalnum() and not text.isalpha()


def _grouped_run(groups: list[str], breaks: list[bool], out: set[str]) -> None:
    """Add to `out` the joined forms `_grouped` indexes from one sequence of groups (`breaks[i]`: a line break
    between groups i and i+1)."""
    if len(groups) < 2:
        return
    if _IBAN_FIRST.fullmatch(groups[0]):  # an IBAN: its prefixes, however many lines it is laid out on
        size = len(groups[0])
        for end in range(1, len(groups)):
            size += len(groups[end])
            if size > _GROUPED_MAX:
                break
            if size >= _GROUPED_MIN:
                out.add("".join(groups[: end + 1]))
        return
    for start in range(len(groups) - 1):
        size, lines = len(groups[start]), 0
        for end in range(start + 1, min(len(groups), start + _GROUPED_GROUPS)):
            size += len(groups[end])
            lines += breaks[end - 1]
            if size > _GROUPED_MAX or lines > 1:
                break
            if size >= _GROUPED_MIN:
                out.add("".join(groups[start : end + 1]))


def _dashless(found: set[str]) -> set[str]:
    """`found` and, for each token made of groups of letters and digits joined by dashes, each group holding a
    digit, `_DASHLESS_MIN` characters or more without them (``123-456-789``, ``de89-3704-0044``), the same
    without its dashes (``123456789``)."""
    dashed = [t for t in found if "-" in t]
    if dashed:
        # Only long ones (an account, a phone number, an IBAN): a range or a date of short groups (``10-12``,
        # ``1-2-3``) is no number the user gave (``1012``).
        found = found | {j for t in _DASHED.findall("\n" + "\n".join(dashed) + "\n")
                         if len(j := t.replace("-", "")) >= _DASHLESS_MIN}
    return found


def _scalar_text(value: Any) -> str | None:
    """The text a non-string leaf is indexed and looked up as (None: nothing to index)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return _number(repr(value)) if "e" not in repr(value) else repr(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None


#: What a string argument is looked up by (`ProvenanceIndex._probe_str`).
_Probe = tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], int, bool]


@dataclass(frozen=True, slots=True)
class ProvenanceLimits:
    """Caps on what one run's index holds (see the module docstring for what happens when reached)."""

    #: Characters of one result indexed (strings past this are cut; the rest counts as not indexed).
    max_result_chars: int = 1_000_000
    #: Entries (whole values and tokens) one result may add.
    max_result_tokens: int = 50_000
    #: Entries one run's index may hold (with the C extension 16-byte slots kept at most half full: 200,000
    #: take 8 MB; without it a dict, about 80 bytes each: ~16 MB).
    max_tokens: int = 200_000
    #: Joined forms of numbers laid out in groups (`_grouped`) one result may give, or one per `_JOINED_PER_CHARS`
    #: characters of its strings when that is more. A string that would take its result past that (a table of
    #: numbers: every run of neighbouring numbers is one, ~180,000 for 100 KB) gives none, and the result's labels
    #: are added to every argument that could be such a form (`_joinable`), not to every argument as for the caps
    #: above.
    max_joined_forms: int = 4_096
    #: Runs of words (phrases) one result of a tool that opts in may add (a 100 KB page of prose gives ~45,000); past
    #: it the result's labels are added to the answer for every argument of two words or more (and the rest of its
    #: phrases are not indexed). They count against `max_tokens` too.
    max_result_phrases: int = 60_000
    #: Records (`same_record`, `same_call`) one run's index keeps, counting each record and each membership of a
    #: short whole value of a result of a tool with sources in its record. A result whose records would take the
    #: run past it keeps none, later values past it none either; the predicates answer only from what was kept
    #: (false for the rest).
    max_record_links: int = 100_000


class FieldLabels(Protocol):
    """Labels of the values at one field path chosen by the record holding them (`sources.fields` with `when`:
    ``content`` is ``trusted`` when the file's ``owner`` is the user): `proctor.policy.dataflow` gives one."""

    def labels_for(self, record: Mapping[str, JSONValue] | None, otherwise: tuple[str, ...]) -> tuple[str, ...]:
        """The labels of the value at the path in `record` (the row holding it: the innermost map that is an item of
        a list, else the result when it is a map; None: none), or
        `otherwise` (what it has without this path) when no choice holds or one cannot be evaluated."""
        ...


@dataclass(frozen=True, slots=True)
class ResultPlan:
    """How one tool result is indexed (`ProvenanceIndex.add_result`): under `result` labels, except the values
    at `fields` paths (each a tuple of steps: a key, ``*`` any key, ``[]`` each item of a list), which get their
    own — a tuple of labels, or `FieldLabels` choosing them per record; with its runs of words too when
    `phrases`; keeping the records its values were in (`same_record`, `same_call`) when `records`."""

    result: tuple[str, ...]
    fields: tuple[tuple[tuple[str, ...], tuple[str, ...] | FieldLabels], ...] = ()
    phrases: bool = False
    records: bool = False


class ResultLabeller(Protocol):
    """What gives a tool's results their labels for one call (`proctor.policy.dataflow.ResultSources`)."""

    def plan(self, tool: str, args: Mapping[str, JSONValue], index: ProvenanceIndex) -> ResultPlan:
        """The plan for this call's result, decided on the arguments and on what `index` holds before it."""
        ...


#: Most distinct field paths an index names (`field_paths`); past it, a value's path is ``TOOL:…``.
_MAX_PATHS = 256
#: Longest whole value whose field path is recorded (ids, addresses, names, titles: not documents).
_PATH_CHARS = 256


def phrase_runs(text: str, shortest: int = 2, longest: int = PHRASE_WORDS) -> list[str]:
    """Every run of `shortest` to `longest` words of `text`, case-folded and joined by one space, by length then
    position (the C extension's `phrases` gives their digests in the same order)."""
    return _runs(_WORD.findall(_fold(text)), shortest, longest)


def _runs(words: list[str], shortest: int, longest: int) -> list[str]:
    out: list[str] = []
    n = len(words)
    for size in range(shortest, longest + 1):
        out.extend(" ".join(words[i : i + size]) for i in range(n - size + 1))
    return out


def _path_name(steps: list[str]) -> str:
    """``['files', '[]', 'id']`` -> ``files[].id``."""
    out = ""
    for step in steps:
        out += step if step == "[]" or not out else "." + step
    return out


def _matches(pattern: tuple[str, ...], steps: list[str]) -> bool:
    return len(pattern) == len(steps) and all(p == s or (p == "*" and s != "[]") for p, s in zip(pattern, steps,
                                                                                                 strict=True))


class ProvenanceIndex:
    """One run's index: keyed digests of values and tokens, each mapped to the labels it came under.

    Thread-safe: calls of one run may be settled by several threads.
    """

    __slots__ = ("_bits", "_call_tool", "_digest", "_entries", "_field_paths", "_fields", "_joined_overflow", "_key",
                 "_labels", "_links", "_lock", "_named", "_native", "_overflow", "_path_bits", "_paths",
                 "_phrase_overflow", "_phrase_probes", "_phrases", "_prefix", "_probes", "_record_call",
                 "_record_tool", "_records", "_sipkey", "_tool_names", "limits")

    def __init__(self, limits: ProvenanceLimits | None = None, *, key: bytes | None = None) -> None:
        self.limits = limits or ProvenanceLimits()
        self._key = key or os.urandom(32)  # per index: never the audit key, never persisted
        # digest -> bitmask of labels: in C with the extension (two 64-bit words an entry), else a dict
        self._entries: dict[int, int] | Digests = _native.Digests() if _native is not None else {}
        self._fields: dict[int, int] = {}  # digest of a result's whole value (a field, an item) -> labels
        self._bits: dict[str, int] = {}  # label -> bit
        self._labels: list[str] = []  # bit position -> label
        self._overflow = 0  # labels of content a cap kept out (never includes `user`'s bit in answers)
        self._joined_overflow = 0  # labels of joined forms `max_joined_forms` kept out (for `_joinable` arguments)
        self._lock = threading.Lock()
        # The digest of a text: with the C extension, SipHash-1-3 under a 128-bit key derived from the index's
        # secret; without it, Python's string hash (SipHash-1-3, 64 bits) of a secret per-index prefix of 128
        # random bits followed by the text. Both are computed in C; one index uses one of them throughout.
        self._native = _native
        self._sipkey = hashlib.blake2b(self._key, digest_size=16, person=b"proctor-prov").digest()
        self._prefix = hashlib.blake2b(self._key, digest_size=16).hexdigest().translate(_LETTERS)
        self._digest: Callable[[str], int] = (functools.partial(_native.digest, self._sipkey) if _native is not None
                                              else self._prefixed_hash)
        self._probes: dict[str, _Probe] = {}  # argument -> the digests it is looked up by
        self._named: dict[int, tuple[str, ...]] = {}  # label mask -> its sorted names
        self._field_paths: dict[int, int] = {}  # digest of a whole value of a result -> bits of the paths it was at
        self._paths: list[str] = []  # path bit -> "TOOL:path"
        self._path_bits: dict[str, int] = {}
        self._phrases = False  # whether a result's runs of words were indexed (then arguments are looked up by theirs)
        self._phrase_overflow = 0  # labels of results whose phrases `max_result_phrases` cut
        self._phrase_probes: dict[str, tuple[int, ...]] = {}  # argument -> digests of its runs of words
        # Records (the maps of results of tools with sources) and calls each short whole value was in: digest ->
        # record numbers; record number -> its call's number and its tool's (in `_tool_names`).
        self._records: dict[int, list[int]] = {}
        self._record_call: list[int] = []
        self._record_tool: list[int] = []
        self._tool_names: list[str] = []
        self._call_tool: list[int] = []  # call number -> its tool's number
        self._links = 0

    # -- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._entries)

    @property
    def overflowed(self) -> tuple[str, ...]:
        """Labels of content a cap kept out of the index (added to every `labels_of` answer), sorted."""
        return tuple(self._names(self._overflow))

    @property
    def numbers_overflowed(self) -> tuple[str, ...]:
        """Labels of results that laid out more numbers in groups than `max_joined_forms` (a table of numbers):
        added to the answer for every argument that could be such a number joined up (7 to 34 ASCII letters
        and digits, a digit among them, as the value, one of its tokens or its compact form), sorted."""
        return tuple(self._names(self._joined_overflow))

    def labels_of(self, value: Any) -> list[str]:
        """The labels of the sources `value`, any item of it, or any token inside it appeared in, sorted.

        After a cap was reached, the labels of what could not be indexed are always included
        (except ``user``): an index that is full errs towards "may have come from there".
        """
        return list(self.sources_of(value))

    def sources_of(self, value: Any) -> tuple[str, ...]:
        """`labels_of` as a tuple (the same object for the same labels: nothing is built per call)."""
        mask = 0
        unseen = self._overflow
        entries = self._entries
        if isinstance(value, str):  # the common case: the argument's digests are remembered
            probe = self._probes.get(value)
            if probe is None:
                probe = self._probe_str(value)
            for digest_ in probe[1]:
                mask |= entries.get(digest_, 0)
            if probe[5]:
                unseen |= self._joined_overflow
            if self._phrases:
                mask, unseen = self._phrase_hits(value, mask, unseen)
        else:
            if self._joined_overflow and self._joinable_inside(value):
                unseen |= self._joined_overflow
            for found in self._probe(value):
                if found is None:  # nested too deep to walk: the part not looked at may come from any source
                    unseen |= (1 << len(self._labels)) - 1
                    break
                mask |= entries.get(found, 0)
            if self._phrases:
                for leaf in _leaves(value, keys=False):
                    if isinstance(leaf, str):
                        mask, unseen = self._phrase_hits(leaf, mask, unseen)
        if unseen:
            user = self._bits.get(USER)
            mask |= unseen & ~(1 << user) if user is not None else unseen
        return self._names(mask)

    def text_labels(self, value: Any) -> list[str]:
        """The labels of the sources in which `value` (or an item of it) appeared **only inside longer
        text** — a token in a message body, a page, a file's content — never as a whole value of a
        result (a field, an item of a list) nor in the task: what a model reading prose picked out.

        After a cap was reached, the overflowing labels are included, as for `labels_of`.
        """
        return list(self.text_sources_of(value))

    def text_sources_of(self, value: Any) -> tuple[str, ...]:
        """`text_labels` as a tuple (the same object for the same labels)."""
        mask = 0
        unseen = self._overflow
        entries, fields, digest = self._entries, self._fields, self._digest
        user = self._bits.get(USER)
        user_bit = 0 if user is None else 1 << user
        for leaf in _leaves(value, keys=False):
            if leaf is _CUT:  # nested too deep to walk: the part not looked at may come from any source
                unseen |= (1 << len(self._labels)) - 1
                break
            text = normalize_whole(leaf) if isinstance(leaf, str) else _scalar_text(leaf)
            if text is None:
                continue
            if _joinable(text):
                unseen |= self._joined_overflow
            key = digest(text)
            found = entries.get(key, 0)
            if found & user_bit:  # the user wrote it: not something a model picked out of prose
                continue
            mask |= found & ~fields.get(key, 0)
            if self._phrases and isinstance(leaf, str):  # a phrase copied out of a result's text
                for phrase in self._phrase_digests(leaf):
                    if phrase != key:
                        mask |= entries.get(phrase, 0) & ~fields.get(phrase, 0)
                if self._phrase_overflow and " " in text:
                    unseen |= self._phrase_overflow
        return self._names(mask | (unseen & ~user_bit))

    def _phrase_digests(self, text: str) -> tuple[int, ...]:
        """The digests an argument is looked up by among phrases: its words joined when two to `PHRASE_WORDS`,
        else each of its runs of `PHRASE_WORDS` words (remembered for short arguments)."""
        found = self._phrase_probes.get(text)
        if found is None:
            words = _WORD.findall(_fold(text))
            if len(words) < 2:
                found = ()
            elif len(words) <= PHRASE_WORDS:
                found = (self._digest(" ".join(words)),)
            else:
                found = tuple({self._digest(" ".join(words[i : i + PHRASE_WORDS]))
                               for i in range(len(words) - PHRASE_WORDS + 1)})
            if len(text) <= _PATH_CHARS:
                if len(self._phrase_probes) >= _PROBES:
                    self._phrase_probes.clear()
                self._phrase_probes[text] = found
        return found

    def _phrase_hits(self, text: str, mask: int, unseen: int) -> tuple[int, int]:
        """`mask` with the labels of the phrases `text` copies, `unseen` with those phrases a cap kept out of."""
        entries = self._entries
        for phrase in self._phrase_digests(text):
            mask |= entries.get(phrase, 0)
        if self._phrase_overflow and " " in text.strip():
            unseen |= self._phrase_overflow
        return mask, unseen

    def field_labels(self, value: Any) -> list[str]:
        """The labels under which `value` appeared **as a whole value of a result** (a field, an item of a list),
        never counting a token inside longer text nor the task: for a list or map, the labels under which every
        item did (so each must have). Only what was indexed answers: a cap that kept content out adds nothing here
        (this says a value *is* a field of a source; `labels_of` says where it *may* have come from)."""
        return list(self._names(self._whole_mask(value, self._fields)))

    def field_paths(self, value: Any) -> list[str]:
        """Where `value` appeared as a whole value of a result, as ``TOOL:PATH`` (``list_files:files[].id``;
        list items are ``[]``, keys that are data ``*``), sorted; for a list or map, the paths every item appeared
        at. Values of up to 256 characters from results of tools with sources (`add_result` given them)."""
        mask = self._whole_mask(value, self._field_paths)
        return sorted(self._paths[i] for i in range(mask.bit_length()) if mask >> i & 1)

    def same_source(self, a: Any, b: Any) -> bool:
        """Whether `a` and `b` appeared as whole values at one ``TOOL:PATH`` (the same field of the same tool):
        every item of each, for lists. Only what was recorded answers (`field_paths`)."""
        return bool(self._whole_mask(a, self._field_paths) & self._whole_mask(b, self._field_paths))

    def same_record(self, a: Any, b: Any, tools: str | Iterable[str] | None = None) -> bool:
        """Whether one record — a row: the innermost map holding them that is an item of a list (else the result
        itself when it is a map), in a result of a tool with sources (of one of
        `tools` when given) — held `a` and `b` (every item of each, for lists) as whole values: the account id
        *of the contact* whose address is the recipient, not an id from another row."""
        return bool(self._shared(a, b, tools, calls=False))

    def same_call(self, a: Any, b: Any, tools: str | Iterable[str] | None = None) -> bool:
        """Whether one call's result (of a tool with sources; of one of `tools` when given) held `a` and `b`
        (every item of each, for lists) as whole values, anywhere in it."""
        return bool(self._shared(a, b, tools, calls=True))

    def _shared(self, a: Any, b: Any, tools: str | Iterable[str] | None, *, calls: bool) -> set[int]:
        names = None if tools is None else {tools} if isinstance(tools, str) else set(tools)
        with self._lock:
            wanted = None if names is None else {i for i, name in enumerate(self._tool_names) if name in names}
            if wanted is not None and not wanted:
                return set()
            found = self._holding(a, calls)
            if found:
                found &= self._holding(b, calls)
            if found and wanted is not None:
                owner = self._record_tool
                if calls:
                    found = {c for c in found if self._call_tool[c] in wanted}
                else:
                    found = {r for r in found if owner[r] in wanted}
        return found

    def _holding(self, value: Any, calls: bool) -> set[int]:
        """The records (or calls) holding every leaf of `value` as a whole value; empty for no leaf (the lock
        held)."""
        found: set[int] | None = None
        digest, records, call_of = self._digest, self._records, self._record_call
        for leaf in _leaves(value, keys=_data_key):
            if leaf is _CUT:
                return set()
            text = normalize_whole(leaf) if isinstance(leaf, str) else _scalar_text(leaf)
            if text is None:
                return set()
            held = records.get(digest(text), ())
            these = {call_of[r] for r in held} if calls else set(held)
            found = these if found is None else found & these
            if not found:
                return set()
        return found or set()

    def _whole_mask(self, value: Any, table: Mapping[int, int]) -> int:
        """The bits `table` gives every leaf of `value` (by its whole form's digest); 0 for no leaf."""
        mask = -1
        digest = self._digest
        for leaf in _leaves(value, keys=_data_key):
            if leaf is _CUT:
                return 0
            text = normalize_whole(leaf) if isinstance(leaf, str) else _scalar_text(leaf)
            if text is None:
                return 0
            mask &= table.get(digest(text), 0)
            if not mask:
                return 0
        return 0 if mask == -1 else mask

    def carries(self, value: Any, labels: Any) -> bool:
        """Whether `value` holds anything from a source labelled `labels` (one label or a list of them): the same
        matching as `labels_of` (whole values, tokens, phrases; a cap errs towards yes)."""
        wanted = (labels,) if isinstance(labels, str) else tuple(labels)
        found = self.sources_of(value)
        return any(label in found for label in wanted)

    def from_user(self, value: Any) -> bool:
        """Whether `value` as a whole came from the task: a string found whole (or made only of
        task tokens), a number the task wrote, a list or map each of whose items did."""
        user = self._bits.get(USER)
        if user is None:
            return False
        if type(value) is str:  # the common case, without the walk
            return self._leaf_from(value, 1 << user)
        return self._from(value, 1 << user, 0)

    def _from(self, value: Any, bit: int, depth: int) -> bool:
        if depth > 64:
            return False
        if isinstance(value, Mapping):  # a key that is data (an IBAN, an address) must be the user's too
            items = [k for k in value if (isinstance(k, int) and not isinstance(k, bool))
                     or (isinstance(k, str) and _data_key(k))] + list(value.values())
        elif isinstance(value, (list, tuple)):
            items = list(value)
        else:
            return self._leaf_from(value, bit)
        return bool(items) and all(self._from(item, bit, depth + 1) for item in items)

    def _leaf_from(self, value: Any, bit: int) -> bool:
        entries = self._entries
        if isinstance(value, str):
            probe = self._probes.get(value)
            if probe is None:
                probe = self._probe_str(value)
            if entries.get(probe[0], 0) & bit or (probe[4] and entries.get(probe[4], 0) & bit):
                return True
            tokens_ = probe[2]
            if not tokens_:  # plain words: the user's when they are a run of the task's words (below)
                return self._words_from(value, bit)
            for token in tokens_:
                if not entries.get(token, 0) & bit:
                    return False
            # Made of task tokens, and the words around them must be the task's too: "ls /tmp/data; rm -rf ~"
            # is not the user's because the task named /tmp/data.
            for word in probe[3]:
                if not entries.get(word, 0) & bit:
                    return False
            return True
        text = _scalar_text(value)
        return text is not None and bool(entries.get(self._digest(text), 0) & bit)

    def _words_from(self, value: str, bit: int) -> bool:
        """Whether `value`, a string without tokens, is a run of the task's words once prose punctuation is set
        aside: ``Paris.``, ``O'Neil``, ``budget, staffing`` (the task's runs are its words joined by one space). A
        value of more than `TASK_WORDS` words must be such a run in each of its windows of `TASK_WORDS` words (a
        long title the user wrote, cut at a word). Characters other than letters, digits, spaces and
        `_PROSE_MARKS` (a ``;``, a ``|``, a ``$``…) keep the value from being read as words: they may change
        what it means."""
        if _NOT_PROSE.search(value) is not None:
            return False
        words = _WORD.findall(_fold(value))
        if not words:
            return False
        entries, digest = self._entries, self._digest
        if len(words) <= TASK_WORDS:
            return bool(entries.get(digest(" ".join(words)), 0) & bit)
        return all(entries.get(digest(" ".join(words[i : i + TASK_WORDS])), 0) & bit
                   for i in range(len(words) - TASK_WORDS + 1))

    def _probe_str(self, value: str) -> _Probe:
        """The digests a string argument is looked up by — (whole, whole and every token, every token, every
        word outside the tokens, the compact form of a number laid out in groups or 0) —
        remembered per index (they depend on the key and the text only, not on what is indexed)."""
        whole, found = _analyze(value)
        digest = self._digest
        whole_digest = digest(whole)
        # (a token written with dashes counts as its dashless spelling: either may be what the user wrote)
        tokens_ = tuple(digest(t) for t in found if "-" not in t or t.replace("-", "") not in found)
        inside = {w for t in found for w in _WORD.findall(t)}
        words = tuple(digest(w) for w in set(_WORD.findall(whole)).difference(inside)
                      if not (w.isdecimal() and len(w) < 3))  # (short numbers of the task are not indexed alone)
        # A number laid out in groups as a whole (1234 5678 9012): the user's when its compact form is (the task
        # wrote 123456789012, or 1234-5678-9012); 0 (no entry) otherwise.
        grouped = _GROUPED.fullmatch(whole)
        compact = "".join(_GROUP.findall(whole)) if grouped is not None else ""
        compact_digest = digest(compact) if _GROUPED_MIN <= len(compact) <= _GROUPED_MAX else 0
        joinable = _joinable(whole) or _joinable(compact) or any(_joinable(t) for t in found)
        probe = (whole_digest, (whole_digest, *(digest(t) for t in found if t != whole)), tokens_, words,
                 compact_digest, joinable)
        if len(value) <= 256:  # as `_analyze_short`: short arguments only (an address, an id, a name)
            probes = self._probes
            if len(probes) >= _PROBES:
                probes.clear()
            probes[value] = probe
        return probe

    @staticmethod
    def _joinable_inside(value: Any) -> bool:
        """Whether `value` (not a str) is looked up by a text that could be a joined form (`_joinable`)."""
        for leaf in _leaves(value, keys=_data_key):
            if leaf is _CUT:
                return True
            if isinstance(leaf, str):
                whole, found = _analyze(leaf)
                if _joinable(whole) or any(_joinable(t) for t in found):
                    return True
            else:
                text = _scalar_text(leaf)
                if text is not None and _joinable(text):
                    return True
        return False

    def _probe(self, value: Any) -> Iterator[int | None]:
        """The digests to look `value` up by; None last when it is nested too deep to walk whole."""
        digest = self._digest
        for leaf in _leaves(value, keys=_data_key):
            if leaf is _CUT:
                yield None
                return
            if isinstance(leaf, str):
                whole, found = _analyze(leaf)
                yield digest(whole)
                for token in found:
                    if token != whole:
                        yield digest(token)
            else:
                text = _scalar_text(leaf)
                if text is not None:
                    yield digest(text)

    def _names(self, mask: int) -> tuple[str, ...]:
        names = self._named.get(mask)
        if names is None:  # bits are never reassigned: a mask names the same labels for the index's life
            names = self._named[mask] = tuple(sorted(self._labels[i] for i in range(mask.bit_length())
                                                     if mask >> i & 1))
        return names

    def _prefixed_hash(self, text: str) -> int:
        return hash(self._prefix + text)

    # -- writing ---------------------------------------------------------------------------------
    def add(self, value: Any, labels: Iterable[str]) -> int:
        """Index one result (or the task) under `labels`; return the number of new entries.

        Strings count against `max_result_chars`, entries against `max_result_tokens` and the
        run's `max_tokens`; whatever a cap keeps out marks `labels` as overflowed.
        """
        names = tuple(labels)
        if not names:
            return 0
        with self._lock:
            mask = 0
            for name in names:
                mask |= 1 << self._bit(name)
        limits = self.limits
        chars_left = limits.max_result_chars
        budget = limits.max_result_tokens  # distinct entries the result may still add
        task = USER in names
        digest = self._digest
        added = 0
        cut = False
        chars_seen = joined_used = 0
        for leaf in _leaves(value, keys=True):
            if leaf is _CUT:
                cut = True
                break
            if isinstance(leaf, str):
                if len(leaf) > chars_left:
                    leaf, cut = leaf[:chars_left], True
                chars_left -= len(leaf)
                chars_seen += len(leaf)
                if task:
                    found = self._task_entries(leaf)
                    over = len(found) > budget
                    kept = list(found)[: max(budget, 0)] if over else found
                    with self._lock:
                        new, full = self._put([digest(t) for t in kept], mask)
                    used = len(kept)
                else:  # never cached: results are not kept in clear anywhere
                    # Joined forms of numbers laid out in groups, for the whole result: a string that would take
                    # the result past its allowance gives none of its own (`max_joined_forms`).
                    allowance = max(limits.max_joined_forms, chars_seen // _JOINED_PER_CHARS) - joined_used
                    whole, new, used, over, full, joined = self._index_text(leaf, mask, budget, allowance)
                    with self._lock:
                        if joined > allowance:
                            self._joined_overflow |= mask
                        else:
                            joined_used += joined
                        if whole in self._entries:  # a whole value of a result (not for one a cap kept out)
                            self._fields[whole] = self._fields.get(whole, 0) | mask
            else:
                text = _scalar_text(leaf)
                if text is None:
                    continue
                key = digest(text)
                over = budget < 1
                with self._lock:
                    new, full = self._put([] if over else [key], mask)
                    if key in self._entries:
                        self._fields[key] = self._fields.get(key, 0) | mask
                used = 0 if over else 1
            added += new
            budget -= used
            cut = cut or full
            if over or chars_left <= 0:
                cut = True
                break
        if cut:
            with self._lock:
                self._overflow |= mask
        return added

    def add_result(self, value: Any, labels: Iterable[str], sources: ResultLabeller | None = None,
                   args: Mapping[str, Any] | None = None, *, tool: str = "") -> int:
        """Index one tool result: as `add` under `labels` when the tool has no `sources`; else as `sources` plans
        it for this call (`ResultLabeller.plan`, decided on `args` and on what the index holds before this
        result): each value at a field path under its own labels, the rest under the call's, and runs of words
        when asked, recording the path of each whole value (`field_paths`). Returns the number of new entries.

        `labels` are every label the result may carry (the tool's `labels`): if the plan cannot be made, the
        whole result is indexed under all of them.
        """
        names = tuple(labels)
        if sources is None:  # one source: exactly `add` (no paths recorded: those are for tools with sources)
            return self.add(value, names)
        try:
            plan = sources.plan(tool, args or {}, self)
        except Exception:  # noqa: BLE001 - fail safe: every label the result may carry, on all of it
            plan = ResultPlan(names)
        groups: dict[tuple[str, ...], list[Any]] = {}
        # (whole leaf, its path, the number in this result of the record holding it or -1) of short values, for
        # `field_paths` and `same_record`
        placed: list[tuple[Any, str, int]] = []
        try:
            cut = self._split(value, plan, groups, placed)
        except Exception:  # noqa: BLE001 - a field's labels that could not be chosen: fail safe as for the plan
            groups, placed = {}, []
            plan = ResultPlan(names)
            cut = self._split(value, plan, groups, placed)
        added = 0
        for group_labels, leaves in groups.items():
            if group_labels:
                added += self.add(leaves, group_labels)
                if plan.phrases:
                    added += self._add_phrases(leaves, group_labels)
        if cut:
            self.mark_incomplete({label for group in groups for label in group} | set(names))
        if placed and tool:
            self._record_paths(tool, placed, plan.records)
        return added

    def _split(self, value: Any, plan: ResultPlan, groups: dict[tuple[str, ...], list[Any]],
               placed: list[tuple[Any, str, int]]) -> bool:
        """Sort the leaves of `value` (and its map keys) into `groups` by the labels `plan` gives their paths (a
        `FieldLabels` choosing them by the record holding the value); True when it is nested too deep or too
        large to walk whole. A value's record is the innermost map holding it that is an item of a list (a row: a
        file, a contact, a message), else the result itself when it is a map; records are numbered in walking
        order."""
        by_length: dict[int, list[tuple[tuple[str, ...], tuple[str, ...] | FieldLabels]]] = {}
        for pattern, own in plan.fields:  # a path matches only a node as deep as it is long
            by_length.setdefault(len(pattern), []).append((pattern, own))
        # (node, its steps, its labels, depth, the record holding it and that record's number, -1 for none, whether
        # a map here is a record: the result itself or an item of a list)
        stack: list[tuple[Any, list[str], tuple[str, ...], int, Mapping[str, Any] | None, int, bool]] = [
            (value, [], plan.result, 0, None, -1, True)]
        budget = _MAX_NODES
        records = 0
        while stack:
            node, steps, labels, depth, record, number, row = stack.pop()
            budget -= 1
            if budget < 0 or depth > _MAX_DEPTH:
                return True
            for pattern, own in by_length.get(len(steps), ()):
                if _matches(pattern, steps):
                    labels = own if isinstance(own, tuple) else own.labels_for(record, labels)
            if isinstance(node, Mapping):
                keys = groups.setdefault(labels, [])
                if row:
                    record, number, records = node, records, records + 1
                for k, v in node.items():
                    if (isinstance(k, int) and not isinstance(k, bool)) or isinstance(k, str):
                        keys.append(k)
                    step = "*" if not isinstance(k, str) or _data_key(k) else k
                    stack.append((v, [*steps, step], labels, depth + 1, record, number, False))
            elif isinstance(node, (list, tuple, set, frozenset)):
                stack.extend((item, [*steps, "[]"], labels, depth + 1, record, number, True) for item in node)
            elif isinstance(node, (str, int, float, bytes)) or node is None:
                groups.setdefault(labels, []).append(node)
                if steps and (not isinstance(node, (str, bytes)) or len(node) <= _PATH_CHARS):
                    placed.append((node, _path_name(steps), number))
            else:  # a model, a dataclass, anything else: as `_leaves` reads it
                dump = getattr(node, "model_dump", None)
                if callable(dump):
                    try:
                        stack.append((dump(), steps, labels, depth + 1, record, number, row))
                        continue
                    except Exception:  # noqa: BLE001 - fall back to its text
                        pass
                groups.setdefault(labels, []).append(str(node))
        return False

    def _record_paths(self, tool: str, placed: list[tuple[Any, str, int]], records: bool) -> None:
        digest = self._digest
        with self._lock:
            room = 0
            first = len(self._record_call)  # this result's record n is the index's record first + n
            if records:
                last = max(number for _, _, number in placed)
                # each record counts as a link too (results of empty maps must not grow the lists unbounded)
                room = self.limits.max_record_links - self._links - (last + 1)
            if room > 0:
                self._links += last + 1
                if tool not in self._tool_names:
                    self._tool_names.append(tool)
                tool_number = self._tool_names.index(tool)
                call = len(self._call_tool)
                self._call_tool.append(tool_number)
                self._record_call.extend([call] * (last + 1))
                self._record_tool.extend([tool_number] * (last + 1))
            for leaf, path, number in placed:
                text = normalize_whole(leaf) if isinstance(leaf, str) else _scalar_text(leaf)
                if text is None:
                    continue
                key = digest(text)
                if key not in self._fields:  # not indexed as a whole value (a cap kept it out)
                    continue
                if number >= 0 and room > 0:
                    record = first + number
                    held = self._records.setdefault(key, [])
                    if not held or held[-1] != record:  # (a value twice in one record counts once)
                        held.append(record)
                        room -= 1
                        self._links += 1
                name = f"{tool}:{path}"
                bit = self._path_bits.get(name)
                if bit is None:
                    if len(self._paths) >= _MAX_PATHS:
                        name = f"{tool}:…"
                        bit = self._path_bits.get(name)
                    if bit is None:
                        bit = self._path_bits[name] = len(self._paths)
                        self._paths.append(name)
                self._field_paths[key] = self._field_paths.get(key, 0) | 1 << bit

    def _add_phrases(self, leaves: list[Any], labels: tuple[str, ...]) -> int:
        """Index the runs of two to `PHRASE_WORDS` words of the strings among `leaves` under `labels`, at most
        `max_result_phrases` runs; past it, mark `labels` for every argument of two words or more."""
        limits = self.limits
        left = limits.max_result_phrases
        chars = limits.max_result_chars
        native = self._native
        digest = self._digest
        with self._lock:
            mask = 0
            for name in labels:
                mask |= 1 << self._bit(name)
        added = 0
        cut = False
        for leaf in leaves:
            if not isinstance(leaf, str) or " " not in leaf.strip():
                continue
            folded = _fold(leaf[:chars])
            chars -= len(folded)
            with self._lock:
                self._phrases = True  # from now on arguments are looked up by their runs of words too
                entries = self._entries
                if native is not None and not isinstance(entries, dict) and folded.isascii():
                    # in C: the words found, each run digested in place and put in the entries (one pass)
                    room = limits.max_tokens - len(entries)
                    done = native.phrases(self._sipkey, folded, PHRASE_WORDS, left, entries, mask, room)
                    if done is not None:
                        new, produced, full, over = done
                        cut = cut or over
                        left -= produced
                        added += new
                        if full or cut or chars <= 0:
                            cut = True
                            break
                        continue
            found = native.phrases(self._sipkey, folded, PHRASE_WORDS, left) if native is not None else None
            if found is None:
                found = [digest(run) for run in _runs(_WORD.findall(folded), 2, PHRASE_WORDS)]
            if len(found) > left or chars <= 0:
                found, cut = found[: max(left, 0)], True
            left -= len(found)
            with self._lock:
                new, full = self._put(found, mask)
            added += new
            if full or cut:
                cut = True
                break
        if cut:
            with self._lock:
                self._phrase_overflow |= mask
        return added

    def _index_text(self, text: str, mask: int, budget: int, joined_cap: int) -> tuple[int, int, int, bool, bool, int]:
        """Index one string of a result: its whole form and its tokens, at most `budget` distinct entries, and
        its joined forms unless there are more than `joined_cap`. Returns (the whole form's digest, new entries,
        distinct entries, over the budget, over the run's cap, distinct joined forms: over `joined_cap`, none
        indexed)."""
        folded = _fold(text)
        limits = self.limits
        long = len(folded) > limits.max_result_chars  # NFKC may lengthen a text up to 18 times (U+FDFA): the cap
        if long:  # holds after it too
            folded = folded[: limits.max_result_chars]
        glued = glued_forms(text) if _GLUE_HINT.search(text) is not None else ()
        native = self._native
        if native is not None:  # tokens, digests and inserts in one C call
            with self._lock:
                room = limits.max_tokens - len(self._entries)
                whole_digest, new, used, over, full, joined = native.index(
                    self._sipkey, folded, self._entries, mask, room, budget, joined_cap)
                if glued and not over:  # a host a sentence was glued to (rare: only after "x.com.They")
                    more = [self._digest(t) for t in glued][: max(budget - used, 0)]
                    added, cut = self._put(more, mask)
                    new, used, over, full = new + added, used + len(more), len(more) < len(glued), full or cut
            return whole_digest, new, used, over, full or long, joined
        whole, inside, joined = _forms_python(folded, joined_cap)
        inside.update(glued)
        entries = [whole, *inside.difference((whole,))]
        over = len(entries) > budget
        kept = entries[: max(budget, 0)] if over else entries
        digest = self._digest
        digests = [digest(t) for t in kept]
        with self._lock:
            new, full = self._put(digests, mask)
        return digest(whole), new, len(kept), over, full or long, joined

    @staticmethod
    def _task_entries(text: str) -> set[str]:
        """What a task's text is indexed as: its whole form, its tokens and its runs of words, without the
        numbers of one or two digits (a day, a count, a list item: too ambiguous to say the user gave that id
        or amount; `June 13` is not file 13)."""
        whole, inside = _analyze_text(text)
        found = {whole, *inside, *_word_runs(text)}
        found.difference_update(t for t in inside | {whole} if t.isdecimal() and len(t) < 3)
        return found

    def _put(self, digests: Iterable[int], mask: int) -> tuple[int, bool]:
        """Add `mask` to the entries of `digests`, new ones while the run's cap allows (the lock held); returns
        (new entries, whether the cap kept one out)."""
        entries = self._entries
        room = self.limits.max_tokens - len(entries)
        if not isinstance(entries, dict):  # the entries in C
            return entries.put(list(digests), mask, room)
        added = 0
        cut = False
        for digest in digests:
            old = entries.get(digest)
            if old is None:
                if room <= 0:
                    cut = True
                    continue
                room -= 1
                added += 1
                entries[digest] = mask
            elif old & mask != mask:
                entries[digest] = old | mask
        return added, cut

    def mark_incomplete(self, labels: Iterable[str]) -> None:
        """Say that content under `labels` exists that this index never saw (a resumed run: its
        earlier results are not restored): every later answer includes them (``user`` excepted)."""
        with self._lock:
            for name in labels:
                self._overflow |= 1 << self._bit(name)

    def _bit(self, name: str) -> int:
        """The bit of label `name`, given it if new (the lock held)."""
        bit = self._bits.get(name)
        if bit is None:
            bit = self._bits[name] = len(self._labels)
            self._labels.append(name)
            if bit == 64 and not isinstance(self._entries, dict):  # the C entries hold label bits 0..63 only
                self._entries = dict(self._entries.items())
        return bit


def _word_runs(text: str) -> Iterator[str]:
    """Every run of 1..TASK_WORDS whole words of `text`, normalised (the task's names and phrases)."""
    words = _WORD.findall(_fold(text))
    for i in range(len(words)):
        first = i + 2 if words[i].isdecimal() and len(words[i]) < 3 else i + 1  # not a short number alone
        for j in range(first, min(i + TASK_WORDS, len(words)) + 1):
            yield " ".join(words[i:j])


#: Yielded by `_leaves` when a value is nested deeper than `_MAX_DEPTH` or holds more than `_MAX_NODES`
#: items (a cyclic structure, say): the rest of it is not indexed.
_LETTERS = str.maketrans("0123456789", "ghijklmnop")  # a hex digest as letters: the prefix stays alphabetic
_CUT: Any = object()
#: String arguments whose lookup digests an index remembers (then it starts again).
_PROBES = 4096
_MAX_DEPTH = 64
_MAX_NODES = 1_000_000


def _data_key(key: str) -> bool:
    """Whether a map key is data rather than a field name: ``{'GB29NWBK60161331926819': 100}`` or
    ``{'eve@evil.example': 'cc'}``, not ``{'to': …}`` (a key with a digit, or not an identifier)."""
    return not key.isidentifier() or any(c.isdigit() for c in key)


def _leaves(value: Any, *, keys: bool | Callable[[str], bool]) -> Iterator[Any]:
    """The scalar leaves of a JSON-like value, depth-first, without recursion; map keys too when `keys`
    (all of them if True, those it accepts if a function)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    budget = _MAX_NODES
    while stack:
        node, depth = stack.pop()
        budget -= 1
        if budget < 0 or depth > _MAX_DEPTH:
            yield _CUT
            return
        if isinstance(node, str):
            yield node
        elif isinstance(node, Mapping):
            for k, v in node.items():
                if keys and ((isinstance(k, int) and not isinstance(k, bool))  # {12345678: 100}: data
                             or (isinstance(k, str) and (keys is True or keys(k)))):
                    yield k
                stack.append((v, depth + 1))
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, (int, float, bytes)) or node is None:
            yield node
        else:  # a model, a dataclass, anything else: indexed as the text a program would print
            dump = getattr(node, "model_dump", None)
            if callable(dump):
                try:
                    stack.append((dump(), depth + 1))
                    continue
                except Exception:  # noqa: BLE001 - fall back to its text
                    pass
            yield str(node)
