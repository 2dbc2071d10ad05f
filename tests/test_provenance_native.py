"""The C tokeniser (proctor._provtok) against the pure-Python one: the same tokens on any text, found again."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor import provenance, unicodenorm
from proctor.provenance import USER, ProvenanceIndex, ProvenanceLimits, tokens

native = provenance._native

# Pieces that exercise every rule of the tokeniser: separators, URL parts, numbers with commas and points, dashed
# groups, IBAN groups, delimiters, markdown, invisible characters, non-ASCII dashes and digits, NUL, lone surrogates.
PIECES = [
    "a", "z", "q7", "0", "7", "00", "1,250", ",000", ".50", ".0", "gb29", "de89", " nwbk", " 6016", " 1331", " 19",
    " ", "  ", "\n", "\t", "\x1c", "\u3000", ".", "@", "/", ":", "#", "+", "_", "-", "%", "~", "=", "?", "&", ",",
    ";", "!", "'", '"', "(", ")", "[", "]", "<", ">", "*", "^", "\\", "|", "`", "$", "://", "www.", "https://",
    "mailto:", "eve@evil.example", "evil.example:443", "?id=77&x=1", "555-0100", "123-456-789", "10-12", "-",
    "\u200b", "\u00ad", "\ufeff", "\u2013", "\u2212", "\u0663", "\uff11", "\uff20", "\u00e9", "\u0130", "\u00df",
    "\ufb01", "\u2167", "\x00", "\ud800", "\udfff", "\U0001d400", "\u00b2", "\u0e51", "\u2028",
    # numbers laid out in groups: group sizes, gaps of spaces, brackets, dots, slashes, underscores, line breaks
    "1234", " 5678", "9012", "(555) ", "123.", "4567", "12/", "nwbk", "abcd", "ab12", "(", ")", "_", "\r\n", "\x85",
    "\u2029", "\x1f", "\x0b", "  ", " - ", "12345678901234567890", "\u00e91", "1\u00e9",
]
TEXTS = st.lists(st.sampled_from(PIECES) | st.text(max_size=2), max_size=48).map("".join)
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=80)  # every code point, surrogates included


def _assert_same(text: str) -> None:
    assert native is not None
    expected = provenance._analyze_text_python(text)
    got = native.analyze(provenance._fold(text))
    assert got == expected, (text, got[1] ^ expected[1])


def test_the_c_tokeniser_is_built() -> None:
    """The extension builds with the package: an install without it must fail this test, not go unnoticed."""
    assert native is not None, ("proctor._provtok did not build, or was built from an older _provtok.c: install a "
                                "C compiler and the Python headers (python3-dev), then `pip install -e '.[dev]'`")


def test_siphash_matches_the_reference_vectors() -> None:
    """The digest's SipHash code gives the reference implementation's SipHash-2-4 vectors (key 00..0f) with 2 and 4
    rounds, and a text's digest is SipHash-1-3 of its UTF-8."""
    assert native is not None
    key = bytes(range(16))
    assert native.siphash(key, b"", 24) == 0x726FDB47DD0E0E31
    assert native.siphash(key, bytes(range(15)), 24) == 0xA129CA6149BE45E5
    assert native.siphash(key, bytes(range(8)), 24) == 0x93F5F5799A932462
    sipkey = bytes(range(16))
    for text in ("", "a", "abcdefg", "abcdefgh", "eve@evil.example", "x" * 1001):
        assert native.digest(sipkey, text) in (native.siphash(sipkey, text.encode(), 13), 1)


@settings(max_examples=examples(2500), deadline=None)
@given(TEXTS)
def test_the_c_and_python_tokenisers_agree_on_token_like_text(text: str) -> None:
    """Random mixes of addresses, URLs, numbers, IBAN groups, separators and odd characters: the same tokens."""
    _assert_same(text)


@settings(max_examples=examples(1000), deadline=None)
@given(ANY_TEXT)
def test_the_c_and_python_tokenisers_agree_on_any_text(text: str) -> None:
    """Any code points (surrogates, NULs, every category): the same whole form and tokens."""
    _assert_same(text)


@pytest.mark.parametrize("text", [
    "a1" * 200_000,  # one huge token
    "eve@evil.example," * 20_000,  # a huge comma list
    "a=1&" * 50_000 + "https://x.example/?q=1",  # a huge query string
    "https://" + "www." * 30_000 + "x.example:443/" + "p/" * 10_000,
    "gb29" + " abcd" * 50_000,  # IBAN groups without end
    "1,000" * 30_000 + ".50",
    "-".join(["12a"] * 60_000),  # a huge dashed number
    "\x00" * 1000 + "x1\x00y2" * 1000,
    ("\u200b" * 3 + "e\u2013v\ufeffe@evil.example ") * 5000,
    "\ud800x1 \udfffy2@z " * 5000,
    "1 " * 100_000,  # a sequence of groups without end
    "1234\n" * 40_000,  # a column of numbers
    "gb29 nwbk " * 20_000 + "gb29" + " 1234" * 20_000,  # IBAN heads and groups without end
    "12.34/56_78(90)-" * 10_000,
    # windows of groups (C: seen_window) beyond its table's 1,024 slots, repeated after, and never repeated
    "".join(f"{i} " for i in range(3000)) * 2,
    "".join(random.Random(7).choice("0123456789 \t\n-.") for _ in range(60_000)),
    "".join("\t".join(str(random.Random(row).randint(0, 10**6)) for _ in range(8)) + "\n" for row in range(2000)),
])
def test_the_c_and_python_tokenisers_agree_on_huge_and_hostile_text(text: str) -> None:
    """Huge tokens, lists, query strings, IBAN-like runs, NULs, invisible characters and lone surrogates."""
    _assert_same(text)


@pytest.mark.parametrize("step", [1, 7])
def test_the_c_and_python_tokenisers_agree_on_every_bmp_character(step: int) -> None:
    """Every BMP code point (C caches their classes at first use) inside tokens, between digits and alone."""
    chars = [chr(c) for c in range(0x80, 0x10000)]
    _assert_same("".join(f"x{c}1 {c}{c} 2{c}@a.b " for c in chars[::step]))
    _assert_same(" ".join(chars[step - 1 :: step]))


@settings(max_examples=examples(300), deadline=None)
@given(TEXTS, st.sampled_from(["untrusted", USER]))
def test_every_token_indexed_in_c_is_found_again(text: str, label: str) -> None:
    """What the C path indexes (digests computed in C) is found by a lookup of each token, and the whole."""
    index = ProvenanceIndex()
    index.add(text, [label])
    for token in tokens(text):
        if label == USER and token.isdecimal() and len(token) < 3:
            continue  # short numbers of a task are not indexed on their own
        assert label in index.labels_of(token), token
    whole = provenance.normalize_whole(text)
    if whole and not (label == USER and whole.isdecimal() and len(whole) < 3):
        assert label in index.labels_of(text)
        assert label in index.labels_of(f" \t{text}\n\n")  # the whole form digested as its bytes go by


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(TEXTS, min_size=1, max_size=4), st.integers(0, 12), st.integers(1, 40),
       st.sampled_from(["untrusted", USER]))
def test_the_c_and_python_paths_apply_the_same_caps(
    results: list[str], per_result: int, per_run: int, label: str,
) -> None:
    """With small caps, both paths mark the same overflow, stay within the run's cap, and without overflow hold
    the same number of entries."""
    limits = ProvenanceLimits(max_result_tokens=per_result, max_tokens=per_run)
    figures = []
    for path in (native, None):
        saved = provenance._native
        provenance._native = path
        try:
            index = ProvenanceIndex(limits)
            for text in results:
                index.add({"a": text, "b": [text.upper(), 12345]}, [label])
        finally:
            provenance._native = saved
        assert len(index) <= per_run
        figures.append((index.overflowed, len(index)))
    assert figures[0][0] == figures[1][0]
    if not figures[0][0]:  # (past a cap, which entries got in may differ: never how many the caps allow)
        assert figures[0][1] == figures[1][1]


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(1, 3000) | st.integers(1, 2**64 - 1), max_size=40),
                          st.integers(0, 2**64 - 1), st.integers(-2, 3000)), max_size=12))
def test_the_c_entries_behave_as_the_dict_they_replace(puts: list[tuple[list[int], int, int]]) -> None:
    """Digests (the index's entries in C) add, or-in masks, respect the room and answer lookups as a dict does."""
    assert native is not None
    table, model = native.Digests(), {}
    for digests, mask, room in puts:
        added, cut = 0, False
        left = room
        for digest in digests:
            if digest in model:
                model[digest] |= mask
            elif left > 0:
                model[digest] = mask
                left -= 1
                added += 1
            else:
                cut = True
        assert table.put(digests, mask, room) == (added, cut)
        assert len(table) == len(model)
    assert dict(table.items()) == model and set(table) == set(model)
    for digest in [*model, 0, -1, 2**64, 12345678901234567]:
        assert (digest in table) == (digest in model)
        assert table.get(digest, -7) == model.get(digest, -7)


VISIBLE = st.lists(st.sampled_from([
    "a", "1", " ", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u2010", "\u2013", "\u2014",
    "\u2212", "\u3002", "\uff61", "\u0301" * 8, "\u0323" * 5, "\u034f", "\U0001f600" * 7, "\U0001d167" * 6,
    "\u00e9", "\ud800", "\u0663",
]) | st.text(max_size=3), max_size=40).map("".join)


@settings(max_examples=examples(1500), deadline=None)
@given(VISIBLE)
def test_visible_is_the_translate_it_replaces_and_finds_every_run_stream_safe_would_cut(text: str) -> None:
    """`visible` gives `str.translate(_INVISIBLE)`, and says a run is there exactly when `stream_safe` would look."""
    assert native is not None
    out, runs = native.visible(text, unicodenorm.non_starters())
    assert out == text.translate(provenance._INVISIBLE)
    assert runs == (not out.isascii() and unicodenorm._suspect_runs().search(out) is not None)
    assert provenance._fold(text) == unicodenorm.nfkc(out).casefold()


JOINING = st.lists(st.sampled_from(["1", "12", "1234", " ", "\t", "\n", "-", ".", "/", "(", ")", "_", "de89", "gb29",
                                    "nwbk", "b1", "\u0660", "\uff11", "\u2013", "\u200b", "\u00a0", "@", ":", "+",
                                    ","]), max_size=300).map("".join)


@settings(max_examples=examples(1500), deadline=None)
@given(st.lists(JOINING, min_size=1, max_size=4), st.integers(0, 40))
def test_the_c_and_python_paths_cut_the_same_joined_forms(texts: list[str], cap: int) -> None:
    """Around a small `max_joined_forms`, shared by a result's strings, both paths index the same entries and say
    the same numbers overflowed."""
    assert native is not None
    key = bytes(range(32))
    limits = ProvenanceLimits(max_joined_forms=cap)
    in_c = ProvenanceIndex(limits, key=key)
    in_c.add(texts, ["untrusted"])
    in_python = ProvenanceIndex(limits, key=key)
    in_python._native = None
    in_python.add(texts, ["untrusted"])
    assert set(in_c._entries) == set(in_python._entries)
    assert in_c.numbers_overflowed == in_python.numbers_overflowed


@settings(max_examples=examples(1500), deadline=None)
@given(JOINING)
def test_every_joined_form_is_one_an_argument_is_flagged_for(text: str) -> None:
    """What a cut drops (`_grouped`'s forms) is always `_joinable`: the labels of a cut reach every argument it could
    have matched (a separator let into a joined form would break this silently)."""
    for form in provenance._grouped(provenance._fold(text)):
        assert provenance._joinable(form), form
