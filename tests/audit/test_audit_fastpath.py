"""The orjson fast path: it only ever accepts lines the exact json check accepts, with the same record and hash."""

from __future__ import annotations

import enum
import hashlib
import importlib
import json
import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from audit_helpers import lines_of, signing_key
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor.audit import AuditLog, records, verify
from proctor.audit.merkle import MerkleFrontier, merkle_root
from proctor.audit.records import GENESIS, LineError, parse_line, parse_record, seal
from proctor.audit.scan import ScanFailure, Scanner
from proctor.audit.verify import feed_lines
from proctor.canonical import canonical_bytes, jsonable

# `proctor.audit.verify` the attribute is the function; the module is reached by name.
verify_module = importlib.import_module("proctor.audit.verify")

# Where JSON encoders disagree: controls, DEL, C1, U+2028/2029, BOM, noncharacters, astral.
SPECIAL = [
    "\x00", "\x01", "\x08", "\t", "\n", "\x0b", "\x0c", "\r", "\x1f", '"', "\\", "/", "\x7f", "\x80", "\x9f",
    "\xa0", "\xad", "\u2028", "\u2029", "\ufeff", "\ufffe", "\uffff", "\ue000", "😀", "\U0010ffff", "é", "日",
]
# Numbers orjson reads differently from json (floats) or not at all, and the 64-bit edges it keeps.
BIG = [2**64, 2**64 - 1, -(2**63), -(2**63) - 1, 10**30, -(10**40), 2**53 + 1]


def _outcome(raw: bytes) -> tuple[str, Any, Any]:
    try:
        rec, leaf = parse_record(raw)
    except LineError as exc:
        return exc.code, exc.message, exc.unreadable
    return "ok", rec, leaf


def _exact(raw: bytes) -> tuple[str, Any, Any]:
    try:
        rec, leaf = records._parse_exact(raw)
    except LineError as exc:
        return exc.code, exc.message, exc.unreadable
    return "ok", rec, leaf


def _same(raw: bytes) -> None:
    fast, exact = _outcome(raw), _exact(raw)
    assert fast == exact, raw
    if fast[0] == "ok":  # equal values could still differ in type (1 == 1.0 == True): repr tells them apart
        assert repr(fast[1]) == repr(exact[1])


def _line(fields: dict[str, Any], seq: int = 0) -> bytes:
    line, _ = seal({"seq": seq, "ts_ns": 1_700_000_000_000_000_000, "kind": "step", "prev": GENESIS, **fields})
    return line[:-1]


def _exact_never_called(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(raw: bytes) -> Any:
        raise AssertionError(f"fell back to the exact check for {raw!r}")

    monkeypatch.setattr(records, "_parse_exact", boom)


def test_the_fast_path_is_on() -> None:
    """With orjson installed and agreeing with canonical_bytes, verification takes the fast path."""
    assert records.ORJSON_FAST
    assert records._FLOAT_MARKED


def test_orjson_and_json_escape_every_code_point_alike() -> None:
    """For every code point, orjson writes and reads a string exactly as the canonical json encoding does."""
    chars = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    # A list delimits each element, so equal bytes mean equal bytes per character.
    encoded = orjson.dumps(chars)
    assert encoded == canonical_bytes(chars)
    assert orjson.loads(encoded) == chars
    assert json.loads(encoded) == chars


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.text(), st.text(), max_size=8))
def test_orjson_sorts_keys_by_code_point_like_json(value: dict[str, str]) -> None:
    """orjson's sorted keys are json's sorted keys, astral and private-use characters included."""
    assert orjson.dumps(value, option=orjson.OPT_SORT_KEYS) == canonical_bytes(value)


@settings(max_examples=examples(500), deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_every_float_orjson_writes_is_marked(value: float) -> None:
    """orjson writes each float with a digit before "." or "e+"/"e-", which the float pre-check relies on."""
    text = orjson.dumps({"x": value})
    assert records.may_hold_float(text), text


@pytest.mark.parametrize("char", SPECIAL)
def test_special_strings_are_accepted_by_the_fast_path(char: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A canonical record holding a character encoders disagree on verifies without the exact check."""
    raw = _line({"note": f"a{char}b", "args": {char: [char, {"k": char}]}})
    expected = _exact(raw)
    _exact_never_called(monkeypatch)
    assert _outcome(raw) == expected
    assert expected[0] == "ok"


def _spellings(char: str) -> set[bytes]:
    """Ways to write `char` inside a JSON string, canonical or not."""
    ascii_form = json.dumps(char, ensure_ascii=True)[1:-1].encode()
    out = {ascii_form, ascii_form.upper().replace(b"\\U", b"\\u"), char.encode("utf-8")}
    if ord(char) < 0x10000:
        out |= {b"\\u%04x" % ord(char), b"\\u%04X" % ord(char)}
    if char == "/":
        out.add(b"\\/")
    return out


@pytest.mark.parametrize("char", SPECIAL)
def test_other_escapes_of_special_strings_get_the_exact_verdict(char: str) -> None:
    """Each way to write the same string (\\u escapes, upper-case hex, escaped slash, raw bytes) is judged by json."""
    raw = _line({"note": f"a{char}b"})
    canonical = b"a" + canonical_bytes(char)[1:-1] + b"b"
    assert canonical in raw
    spellings = _spellings(char)
    assert len(spellings) >= 2
    for spelling in spellings:
        _same(raw.replace(canonical, b"a" + spelling + b"b", 1))


@pytest.mark.parametrize("number", BIG)
def test_integers_beyond_64_bits_verify_through_the_exact_check(number: int) -> None:
    """orjson reads ints beyond 64 bits as floats; such records still verify, exactly as before."""
    raw = _line({"n": number, "deep": [{"m": number}]})
    _same(raw)
    assert _outcome(raw)[0] == "ok"
    assert _outcome(raw)[1]["n"] == number


@pytest.mark.parametrize("text", [b"1.5", b"-0.0", b"1e+16", b"1e16", b"1E5", b"5e-324", b"1.0", b"-2.5e-7", b"0.1"])
def test_floats_are_noncanonical_on_both_paths(text: bytes) -> None:
    """A float anywhere, in any notation, is NONCANONICAL, even where orjson would write it back unchanged."""
    raw = _line({"n": 1, "deep": [{"m": 2}]})
    for edited in (raw.replace(b'"n":1', b'"n":' + text), raw.replace(b'"m":2', b'"m":' + text)):
        _same(edited)
        assert _outcome(edited)[0] == "NONCANONICAL"


@pytest.mark.parametrize(
    "edit",
    [
        lambda r: r.replace(b'"kind"', b'"kind":"step","kind"', 1),  # duplicate key: orjson keeps the last
        lambda r: r.replace(b'"note":"x",', b"", 1).replace(b'"ts_ns"', b'"note":"x","ts_ns"', 1),  # key order
        lambda r: r.replace(b":", b": ", 1),
        lambda r: r + b" ",
        lambda r: b" " + r,
        lambda r: r + b"\r",
        lambda r: b"\xef\xbb\xbf" + r,  # BOM
        lambda r: r.replace(b'"x"', b'"\xed\xa0\x80"'),  # an encoded surrogate: not UTF-8
        lambda r: r.replace(b'"x"', b'"\xc0\xaf"'),  # overlong encoding
        lambda r: r.replace(b'"x"', b'"\\ud800"'),  # lone surrogate escape
        lambda r: r.replace(b'"x"', b'"\\ud83d\\ude00"'),  # a valid pair, escaped
        lambda r: r.replace(b'"x"', b'"\x01"'),  # raw control character
        lambda r: r.replace(b'"x"', b"-0"),
        lambda r: r.replace(b'"x"', b"01"),
        lambda r: r.replace(b'"x"', b"NaN"),
        lambda r: r.replace(b'"x"', b"1e400"),
        lambda r: b"[" + r + b"]",
        lambda r: r[:-1],
        lambda r: r.replace(b'"h":"', b'"h":1,"hh":"'),
    ],
)
def test_noncanonical_and_broken_lines_get_the_exact_verdict(edit: Any) -> None:
    """Duplicate keys, reordering, whitespace, BOM, bad UTF-8, escapes, odd numbers: the same code and message."""
    raw = _line({"note": "x", "other": "x"})
    edited = edit(raw)
    assert edited != raw
    _same(edited)
    assert _outcome(edited)[0] != "ok"


@pytest.mark.parametrize("depth", [1, 100, 253, 254, 255, 600, 1100])
def test_deep_nesting_gets_the_exact_verdict(depth: int) -> None:
    """orjson writes at most 254 levels and reads at most 1024; deeper records are judged by json alone."""
    deep = b"[" * depth + b"1" + b"]" * depth
    tail = canonical_bytes({"h": "0" * 64, "kind": "step", "prev": GENESIS, "seq": 0, "ts_ns": 1})
    raw = b'{"deep":' + deep + b"," + tail[1:]
    _same(raw)
    _same(raw.replace(b"1]", b"1.5]", 1))


def test_where_h_is_cut_matches_the_exact_check() -> None:
    """A nested "h" before the top-level one, h last, h not a string: the same hash or the same error."""
    h = "ab" * 32
    base = {"kind": "step", "prev": GENESIS, "seq": 0, "ts_ns": 1}
    for extra in ({"a": {"h": h, "z": 1}}, {"a": {"h": "other", "z": 1}}, {"a": [{"h": h}]}, {}):
        _same(canonical_bytes({**base, **extra, "h": h}))
    _same(canonical_bytes({"h": h}))  # h is the last key: not followed by the envelope
    _same(canonical_bytes({**base, "h": 5}))
    _same(canonical_bytes({**base, "h": None}))
    _same(canonical_bytes({**base, "h": "é" * 64}))
    _same(canonical_bytes(base))


json_leaf = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.text() | st.sampled_from(SPECIAL) | st.floats(allow_nan=False, allow_infinity=False)
)
json_values = st.recursive(
    json_leaf,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=16,
)


@settings(max_examples=examples(300), deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6), st.data())
def test_any_record_and_any_byte_edit_get_the_exact_verdict(fields: dict[str, Any], data: st.DataObject) -> None:
    """For sealed records of any content, and any one-byte edit of them, fast and exact paths agree."""
    fields = {k: v for k, v in fields.items() if k not in records.ENVELOPE}
    try:
        raw = _line(fields)
    except (UnicodeEncodeError, ValueError, TypeError):
        return  # lone surrogates cannot be UTF-8: the writer refuses these
    _same(raw)
    for _ in range(4):
        pos = data.draw(st.integers(0, len(raw) - 1), label="position")
        byte = data.draw(st.integers(0, 255), label="byte")
        _same(raw[:pos] + bytes([byte]) + raw[pos + 1 :])


def _scan(lines: list[bytes], *, batched: bool) -> tuple[Any, ...]:
    scanner = Scanner(pubkey=signing_key().public_key())
    failure = None
    try:
        if batched:  # in chunks of random sizes, as file reads cut them, so batches start anywhere
            rng, start, line, offset = random.Random(len(lines)), 0, 0, 0
            while start < len(lines):
                size = rng.choice([1, 2, 3, 30, 31, 32, 33, 64, 100])
                line, offset = feed_lines(scanner, lines[start : start + size], line, offset)
                start += size
        else:
            offset = 0
            for number, raw in enumerate(lines, 1):
                scanner.feed(raw, number, offset)
                offset += len(raw) + 1
    except ScanFailure as exc:
        failure = (exc.failure, exc.unreadable)
    return (failure, scanner.count, scanner.head, scanner.frontier.root_hex(), _open(scanner), scanner.checkpoints,
            scanner.signed, scanner.log_id, scanner.key_ids, scanner.last_checkpoint_seq)


def _open(scanner: Scanner) -> tuple[Any, ...]:
    o = scanner.open
    return o.intents, o.runs, o.approvals, o.recoveries


def _corpora(data: bytes, seed: int, edits: int) -> list[bytes]:
    """`data`, random one-byte edits of it, and records deleted, duplicated and swapped."""
    rng = random.Random(seed)
    out = [data]
    for _ in range(edits):
        pos = rng.randrange(len(data))
        out.append(data[:pos] + bytes([rng.randrange(256)]) + data[pos + 1 :])
    lines = lines_of(data)
    for i in (0, 1, 5, 31, 32, 33, len(lines) // 2, len(lines) - 1):
        out.append(b"".join(lines[:i] + lines[i + 1 :]))
        out.append(b"".join([*lines[:i], lines[i], *lines[i:]]))
        out.append(b"".join([*lines[:i], *lines[i + 1 : i + 2], lines[i], *lines[i + 2 :]]))
        record = json.loads(lines[i])
        del record["h"]
        forgeries: list[dict[str, Any]] = [
            {**record, "ts_ns": record["ts_ns"] + 1},  # resealed: the next record's prev breaks
            {**record, "n": 1.5},
            {**record, "args": {"n": [2.0]}},
            {**record, "n": 1e16},
            {**record, "seq": True if i == 1 else float(i)},
            {**record, "ts_ns": str(record["ts_ns"])},
            {**record, "kind": "nonsense"},
            {**record, "kind": ["call_intent"]},
            {**record, "prev": 7},
            {k: v for k, v in record.items() if k != "ts_ns"},
            {**record, "a": {"h": "x", "z": 1}},
            {**record, "call_id": 5},
        ]
        for forged in forgeries:
            out.append(b"".join([*lines[:i], _forge(forged), *lines[i + 1 :]]))
    return out


def _forge(record: dict[str, Any]) -> bytes:
    """A record line with a correct h over any content, floats and bools included (what a forger writes)."""
    def canon(value: Any) -> bytes:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()

    h = hashlib.sha256(b"\x00" + canon(record)).hexdigest()
    return canon({**record, "h": h}) + b"\n"


def _log(path: Path, records: int, every: int) -> bytes:
    with AuditLog(path, signing_key=signing_key(), durability="flush", checkpoint_every=every) as log:
        for i in range(records):
            if i % 11 == 0:
                log.append("run_started", {"run_id": f"r{i}"})
            if i % 7 == 3:
                log.append("approval_requested", {"run_id": "r", "call_id": f"c{i}", "tool": "t"})
            if i % 14 == 3:
                log.append("approval_resolved", {"run_id": "r", "call_id": f"c{i}", "verdict": "approve"})
            if i % 13 == 12:
                log.append("run_finished", {"run_id": f"r{i - 12}", "status": "done"})
            log.append("call_intent", {"call_id": f"c{i}", "tool": "t", "run_id": "r", "args": {"s": SPECIAL[i % 27]}})
            if i % 5:
                n = BIG[i % len(BIG)] if i % 23 == 0 else i
                log.append("call_outcome", {"call_id": f"c{i}", "status": "ok", "n": n})
    return path.read_bytes()


@pytest.mark.parametrize(("records", "every"), [(40, 7), (150, 1000), (150, 64)])
def test_feed_lines_equals_feeding_line_by_line(tmp_path: Path, records: int, every: int) -> None:
    """The batched and inlined loops report what per-line feeding reports, for real logs and edits of them."""
    data = _log(tmp_path / "a.jsonl", records, every)
    for corpus in _corpora(data, records + every, examples(150)):  # random edits: as many as examples
        parts = corpus.split(b"\n")
        parts.pop()
        assert _scan(parts, batched=True) == _scan(parts, batched=False)


_BASE: list[bytes] = []


def _base_lines() -> list[bytes]:
    """One real log of every kind the bookkeeping tracks (made once), as lines without newlines."""
    if not _BASE:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            _BASE.extend(_log(Path(tmp) / "base.jsonl", 60, 25).split(b"\n")[:-1])
    return _BASE


@settings(max_examples=examples(300), deadline=None)
@given(st.data())
def test_the_fast_path_accepts_nothing_the_reference_rejects(data: st.DataObject) -> None:
    """Whenever `_accept_batch` accepts a batch (real, edited, reordered), `Scanner.feed` reaches the same state."""
    lines = _base_lines()
    start = data.draw(st.integers(0, len(lines) - 1), label="start")
    batch = list(lines[start : start + data.draw(st.integers(1, 40), label="size")])
    for _ in range(data.draw(st.integers(0, 3), label="edits")):
        j = data.draw(st.integers(0, len(batch) - 1), label="line")
        how = data.draw(st.sampled_from(["byte", "drop", "dup", "swap", "forge"]), label="how")
        if how == "byte":
            pos = data.draw(st.integers(0, len(batch[j]) - 1), label="pos")
            batch[j] = batch[j][:pos] + bytes([data.draw(st.integers(0, 255), label="b")]) + batch[j][pos + 1 :]
        elif how == "drop" and len(batch) > 1:
            del batch[j]
        elif how == "dup":
            batch.insert(j, batch[j])
        elif how == "swap" and j + 1 < len(batch):
            batch[j], batch[j + 1] = batch[j + 1], batch[j]
        elif how == "forge":
            try:
                record = json.loads(batch[j])
            except ValueError:  # a line an earlier edit broke: nothing to forge from
                continue
            if not isinstance(record, dict):
                continue
            record.pop("h", None)
            record[data.draw(st.sampled_from(["kind", "call_id", "run_id", "seq", "n"]), label="field")] = \
                data.draw(json_leaf, label="value")
            batch[j] = _forge(record)[:-1]
    fast, reference = Scanner(pubkey=signing_key().public_key()), Scanner(pubkey=signing_key().public_key())
    for scanner in (fast, reference):
        offset = 0
        for number, raw in enumerate(lines[:start], 1):
            scanner.feed(raw, number, offset)
            offset += len(raw) + 1
    pending: list[bytes] = []
    if not verify_module._accept_batch(fast, batch, pending):
        assert (fast.count, fast.head, _open(fast)) == (reference.count, reference.head, _open(reference))
        return
    fast.frontier.extend(pending)
    offset = 0
    for number, raw in enumerate(batch, start + 1):
        reference.feed(raw, number, offset)  # raises ScanFailure if the fast path accepted a bad batch
        offset += len(raw) + 1
    assert (fast.count, fast.head, fast.frontier.root_hex(), _open(fast)) == (
        reference.count, reference.head, reference.frontier.root_hex(), _open(reference))


def test_whole_batches_are_accepted_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On an intact log of plain records, only the checkpoint is fed line by line."""
    path = tmp_path / "b.jsonl"
    with AuditLog(path, signing_key=signing_key(), durability="flush", checkpoint_every=1000) as log:
        for i in range(200):
            log.append("call_intent", {"call_id": f"c{i}", "tool": "t", "run_id": "r", "args": {"to": "a@b.example"}})
            log.append("call_outcome", {"call_id": f"c{i}", "status": "ok"})
    each: list[int] = []
    original = verify_module._feed_reference

    def spy(scanner: Scanner, parts: list[bytes], line: int, offset: int) -> tuple[int, int]:
        each.append(len(parts))
        return original(scanner, parts, line, offset)

    monkeypatch.setattr(verify_module, "_feed_reference", spy)
    report = verify(path, pubkey=signing_key().public_key())
    assert report.ok and report.records == 401
    assert each == [1]  # only the closing checkpoint


def test_logs_with_special_strings_and_big_ints_verify(tmp_path: Path) -> None:
    """A log whose records hold every special character and >64-bit ints verifies, and edits to them are caught."""
    path = tmp_path / "s.jsonl"
    with AuditLog(path, signing_key=signing_key(), durability="flush") as log:
        for i, char in enumerate(SPECIAL):
            assert log.append("step", {"run_id": "r", "text": char * 3, "n": BIG[i % len(BIG)]}).ok
    assert verify(path, pubkey=signing_key().public_key()).ok
    lines = lines_of(path.read_bytes())
    big = next(i for i, line in enumerate(lines) if str(2**64).encode() in line)
    lines[big] = lines[big].replace(str(2**64).encode(), str(2**64 + 1).encode())
    path.write_bytes(b"".join(lines))
    report = verify(path, pubkey=signing_key().public_key())
    assert report.failure is not None
    assert (report.failure.code, report.failure.seq) == ("HASH_MISMATCH", big)


def test_parse_line_is_parse_record_in_hex() -> None:
    """parse_line still returns the computed h as hex."""
    raw = _line({"note": "x"})
    rec, computed = parse_line(raw)
    assert computed == rec["h"] == parse_record(raw)[1].hex()


@pytest.mark.parametrize("start", [0, 1, 2, 3, 5, 8, 13, 64, 100])
def test_bulk_merkle_extend_equals_appending_one_by_one(start: int) -> None:
    """Adding leaves in bulk gives the same frontier and root as appending each, from any starting size."""
    leaves = [bytes([i % 256]) * 32 for i in range(300)]
    rng = random.Random(start)
    for _ in range(20):
        reference, bulk = MerkleFrontier(), MerkleFrontier()
        for leaf in leaves[:start]:
            reference.append(leaf)
            bulk.append(leaf)
        bulk.extend([])
        cut = start
        while cut < len(leaves):
            batch = leaves[cut : cut + rng.choice([1, 2, 3, 7, 8, 16, 33, 64, 200])]
            for leaf in batch:
                reference.append(leaf)
            bulk.extend(batch)
            assert (bulk.size, bulk.root()) == (reference.size, reference.root())
            cut += len(batch)
        assert bulk.root() == merkle_root(leaves)


def _seal_both(record: dict[str, Any]) -> None:
    """seal (orjson when it may) and the json-only sealing give the same line and h, or the same error."""
    try:
        fast: Any = seal(record)
    except (TypeError, ValueError, RecursionError) as exc:
        fast = type(exc)
    try:
        exact: Any = records._seal_json(dict(jsonable(record)))
    except (TypeError, ValueError, RecursionError) as exc:
        exact = type(exc)
    assert fast == exact
    if not isinstance(fast, type):
        assert fast[0] == canonical_bytes({**record, "h": fast[1]}) + b"\n"


class Color(enum.IntEnum):
    RED = 1


class Mood(str, enum.Enum):
    CALM = "calm"


class Odd(str, enum.Enum):
    ONE = 1  # str data "1", value 1: the two encoders would disagree


class Truthy(int, enum.Enum):
    YES = True  # int data 1, value True


class Key(str):
    def __lt__(self, other: object) -> bool:
        return not str.__lt__(self, other)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fields",
    [
        {"args": {c: c for c in SPECIAL}},
        {"n": 2**64, "m": -(2**63) - 1, "k": 2**64 - 1},
        {"e": Color.RED, "m": Mood.CALM, "o": Odd.ONE, "t": Truthy.YES},
        {"args": {Key("b"): 1, Key("a"): 2, "c": [Key("x")]}},
        {"f": 1.5, "b": b"\x00\xff", "t": (1, 2), "s": {3, 1}},
        {"bad": "\ud800"},
    ],
)
def test_seal_writes_the_bytes_json_writes(fields: dict[str, Any]) -> None:
    """Special characters, 64-bit edges, enums, str subclasses, tagged floats: orjson sealing changes no byte."""
    _seal_both({"seq": 3, "ts_ns": 1, "kind": "step", "prev": GENESIS, **fields})


@pytest.mark.parametrize("depth", [10, 254, 255, 400])
def test_seal_of_deep_values_writes_the_bytes_json_writes(depth: int) -> None:
    """orjson refuses nesting over 254 levels; json seals those instead."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    _seal_both({"seq": 0, "ts_ns": 1, "kind": "step", "prev": GENESIS, "deep": value})


@settings(max_examples=examples(200), deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values | st.binary(max_size=8), max_size=6))
def test_seal_of_any_fields_writes_the_bytes_json_writes(fields: dict[str, Any]) -> None:
    """For arbitrary JSON-able fields the sealed line and h do not depend on orjson."""
    _seal_both({"seq": 0, "ts_ns": 1, "kind": "step", "prev": GENESIS, **fields})


def test_seal_of_plain_records_uses_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """A record of plain JSON types is sealed without the json encoder."""
    record = {"seq": 0, "ts_ns": 1, "kind": "step", "prev": GENESIS, "args": {"x": ["\u2028", 2**63 - 1, None]}}
    expected = records._seal_json(dict(jsonable(record)))

    def boom(plain: dict[str, Any]) -> Any:
        raise AssertionError("sealed with json")

    monkeypatch.setattr(records, "_seal_json", boom)
    assert seal(record) == expected


def test_an_anchor_inside_a_batch_is_checked(tmp_path: Path) -> None:
    """A trusted checkpoint naming an ordinary record of another history is a FORK there, batches or not."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for path, n in ((a, 100), (b, 150)):
        with AuditLog(path, signing_key=signing_key(), durability="flush", checkpoint_every=1000) as log:
            for i in range(n):
                assert log.append("step", {"run_id": "r", "step": i, "log": path.name}).ok
    report = verify(b, pubkey=signing_key().public_key(), trusted_checkpoint=str(a) + ".checkpoint")
    assert report.failure is not None
    assert (report.failure.code, report.failure.seq, report.failure.line) == ("FORK", 100, 101)


_BOOK_KINDS = ["call_intent", "call_outcome", "run_started", "run_resumed", "run_finished", "run_suspended",
               "approval_requested", "approval_resolved", "recovery", "step", "checkpoint"]


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_BOOK_KINDS), st.sampled_from(["a", "b", "c", 5, None]),
                          st.sampled_from(["r", "s", 7])), max_size=40), st.booleans())
def test_note_many_is_note_record_by_record(items: list[tuple[str, Any, Any]], segment: bool) -> None:
    """OpenItems.note_many leaves what calling note on each record in turn leaves, segments included."""
    from proctor.audit.scan import OpenItems

    kinds = [kind for kind, _, _ in items]
    recs = [{"call_id": call_id, "run_id": run_id, "tool": "t"} for _, call_id, run_id in items]
    seqs = list(range(len(items)))
    one, many = OpenItems(segment=segment), OpenItems(segment=segment)
    for kind, rec, seq in zip(kinds, recs, seqs, strict=True):
        one.note(kind, rec, seq)
    many.note_many(kinds, recs, seqs)
    assert (one.intents, one.runs, one.approvals, one.recoveries, one.closed) == (
        many.intents, many.runs, many.approvals, many.recoveries, many.closed)


@given(st.lists(st.sampled_from([b"\n", b"a", b"\r", b"\r\n", b"{}", b"\x00"]), max_size=30).map(b"".join))
def test_split_lines_is_bytes_split(data: bytes) -> None:
    """The verifier's memchr line splitting cuts a chunk exactly where bytes.split(b"\\n") does."""
    assert verify_module._split_lines(data) == data.split(b"\n")
