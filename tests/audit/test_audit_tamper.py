"""The tamper matrix: each kind of edit, over log sizes and positions, found with its code at its record."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from audit_helpers import (
    EVERY,
    built,
    bump_ts,
    checkpoint_positions,
    lines_of,
    offset_of,
    other_key,
    rec,
    rechain,
    reseal,
    resign,
    signing_key,
)

from proctor.audit import AuditLog, verify
from proctor.audit.records import seal
from proctor.errors import AuditCorrupted

SIZES = [0, 1, 2, 3, 5, 8, 9]
POSITIONS = ["first", "middle", "last"]

# A mutation takes the log's lines and a position, and returns the edited lines and the
# expected (code, seq, index of the reported line in the edited lines or None for "at the end").
Expect = tuple[list[bytes], str, int, int | None]
Mutation = Callable[[list[bytes], int], Expect]


def _index(total: int, position: str) -> int:
    return {"first": 0, "middle": total // 2, "last": total - 1}[position]


def _is_ckpt(lines: list[bytes], i: int) -> bool:
    return rec(lines[i])["kind"] == "checkpoint"


def flip_byte(lines: list[bytes], i: int) -> Expect:
    out = list(lines)
    out[i] = re.sub(rb'"ts_ns":(\d+)', lambda m: b'"ts_ns":' + str(int(m[1]) ^ 1).encode(), out[i])
    return out, "HASH_MISMATCH", i, i


def flip_and_rehash(lines: list[bytes], i: int) -> Expect:
    out = list(lines)
    out[i] = reseal(bump_ts(rec(out[i])))
    if _is_ckpt(lines, i):
        return out, "CKPT_SIG", i, i  # ts_ns is part of the signed statement
    return out, "PREV_MISMATCH", i + 1, i + 1


def rechain_to_end(lines: list[bytes], i: int) -> Expect:
    out = list(lines)
    out[i] = reseal(bump_ts(rec(out[i])))
    out = rechain(out, i + 1)
    c = min(p for p in checkpoint_positions(lines) if p >= i)
    if c == i:
        return out, "CKPT_SIG", i, i
    return out, "CKPT_ROOT", c, c  # the next signed checkpoint's head/root no longer match


def delete(lines: list[bytes], i: int) -> Expect:
    out = lines[:i] + lines[i + 1 :]
    if i == len(lines) - 1:
        return out, "ROLLBACK", i, None  # only the side file knows the last record existed
    return out, "SEQ_GAP", i, i


def swap(lines: list[bytes], i: int) -> Expect:
    j = min(i, len(lines) - 2)
    out = list(lines)
    out[j], out[j + 1] = out[j + 1], out[j]
    return out, "SEQ_GAP", j, j


def duplicate(lines: list[bytes], i: int) -> Expect:
    out = [*lines[:i + 1], lines[i], *lines[i + 1:]]
    return out, "SEQ_GAP", i + 1, i + 1


def insert_forged(lines: list[bytes], i: int) -> Expect:
    prev = rec(lines[i - 1])["h"] if i else "0" * 64
    forged, _ = seal({"seq": i, "ts_ns": rec(lines[i])["ts_ns"], "kind": "step", "prev": prev,
                      "run_id": "run_1", "step": 99, "note": "forged"})
    out = [*lines[:i], forged, *lines[i:]]
    if i == len(lines) - 1:
        return out, "FORK", i, i  # it takes the place of the checkpoint the side file holds
    return out, "SEQ_GAP", i + 1, i + 1


def truncate_at(lines: list[bytes], i: int) -> Expect:
    return lines[:i], "ROLLBACK", i, None


def blank_line(lines: list[bytes], i: int) -> Expect:
    return [*lines[:i], b"\n", *lines[i:]], "PARSE", i, i


def crlf(lines: list[bytes], i: int) -> Expect:
    out = list(lines)
    out[i] = out[i][:-1] + b"\r\n"
    return out, "NONCANONICAL", i, i


def whitespace(lines: list[bytes], i: int) -> Expect:
    out = list(lines)
    out[i] = out[i].replace(b'":', b'": ', 1)
    return out, "NONCANONICAL", i, i


def duplicate_key(lines: list[bytes], i: int) -> Expect:
    out = list(lines)
    out[i] = b'{"kind":"step",' + out[i][1:]
    return out, "NONCANONICAL", i, i


MUTATIONS: dict[str, Mutation] = {
    "flip_byte": flip_byte,
    "flip_and_rehash": flip_and_rehash,
    "rechain_to_end": rechain_to_end,
    "delete": delete,
    "swap": swap,
    "duplicate": duplicate,
    "insert_forged": insert_forged,
    "truncate_before_last_checkpoint": truncate_at,
    "blank_line": blank_line,
    "crlf": crlf,
    "noncanonical_whitespace": whitespace,
    "duplicate_key": duplicate_key,
}


def _write(tmp_path: Path, lines: list[bytes], side: bytes | None) -> Path:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"".join(lines))
    if side is not None:
        Path(str(path) + ".checkpoint").write_bytes(side)
    return path


def _expect(path: Path, lines: list[bytes], code: str, seq: int, index: int | None, **kw: object) -> None:
    report = verify(path, pubkey=kw.pop("pubkey", signing_key().public_key()), **kw)  # type: ignore[arg-type]
    assert report.failure is not None, f"undetected: {report}"
    f = report.failure
    assert (f.code, f.seq) == (code, seq), f
    if index is None:
        assert (f.line, f.offset) == (len(lines) + 1, sum(map(len, lines))), f
    else:
        assert (f.line, f.offset) == (index + 1, offset_of(lines, index)), f
    assert not report.ok


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("templates")


# Every (mutation, size, position); a one-record log (size 0: just the closing checkpoint)
# has no neighbours to swap, so that combination does not exist rather than being skipped.
CASES = [
    (m, size, position)
    for m in MUTATIONS
    for size in SIZES
    for position in POSITIONS
    if not (m == "swap" and size == 0)
]


@pytest.mark.parametrize(("mutation", "size", "position"), CASES)
def test_tamper_is_found_at_the_right_record(
    mutation: str, size: int, position: str, templates: Path, tmp_path: Path
) -> None:
    """Each edit of a signed log is reported with its code, seq, line and byte offset."""
    data, side = built(templates, size)
    lines = lines_of(data)
    i = _index(len(lines), position)
    edited, code, seq, index = MUTATIONS[mutation](lines, i)
    _expect(_write(tmp_path, edited, side), edited, code, seq, index)


@pytest.mark.parametrize("size", SIZES)
def test_intact_logs_verify(size: int, templates: Path, tmp_path: Path) -> None:
    """The untouched logs of every size verify with the pinned key and carry no warnings."""
    data, side = built(templates, size)
    report = verify(_write(tmp_path, lines_of(data), side), pubkey=signing_key().public_key())
    assert report.ok and report.failure is None
    assert report.records == len(lines_of(data))
    assert report.warnings == []


@pytest.mark.parametrize("size", [s for s in SIZES if s > EVERY])
def test_truncate_after_the_last_periodic_checkpoint(size: int, templates: Path, tmp_path: Path) -> None:
    """Cutting everything after the last periodic checkpoint is a ROLLBACK against the side file."""
    data, side = built(templates, size)
    lines = lines_of(data)
    cut = checkpoint_positions(lines)[-2] + 1
    edited, code, seq, index = truncate_at(lines, cut)
    _expect(_write(tmp_path, edited, side), edited, code, seq, index)
    # Without side file or trusted checkpoint a log cut at a checkpoint is indistinguishable
    # from a shorter log: that is the limit of any hash chain, and what anchors are for.
    Path(str(tmp_path / "audit.jsonl") + ".checkpoint").unlink()
    assert verify(tmp_path / "audit.jsonl").ok


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("size", SIZES)
def test_rollback_to_a_shorter_valid_log_with_a_trusted_checkpoint(
    size: int, position: str, templates: Path, tmp_path: Path
) -> None:
    """A log cut back and resealed by a writer verifies alone, but not against a trusted checkpoint."""
    data, side = built(templates, size)
    lines = lines_of(data)
    trusted = tmp_path / "trusted.checkpoint"
    trusted.write_bytes(side)
    path = _write(tmp_path, lines[: _index(len(lines), position)], None)
    with AuditLog(path, signing_key=signing_key()):
        pass
    assert verify(path, pubkey=signing_key().public_key()).ok  # a perfectly valid, shorter log
    new = lines_of(path.read_bytes())
    if len(new) <= len(lines) - 1:
        _expect(path, new, "ROLLBACK", len(new), None, trusted_checkpoint=trusted)
    else:
        _expect(path, new, "FORK", len(lines) - 1, len(lines) - 1, trusted_checkpoint=trusted)
    path.unlink()
    _expect(_write(tmp_path, lines[:0], None), [], "ROLLBACK", 0, None, trusted_checkpoint=trusted)


@pytest.mark.parametrize("size", SIZES)
def test_torn_last_line_is_recovered(size: int, templates: Path, tmp_path: Path) -> None:
    """A half-written last line is a PARSE failure until reopening cuts it into a recovery record."""
    data, side = built(templates, size)
    lines = lines_of(data)
    torn = reseal({"seq": len(lines), "ts_ns": 1, "kind": "step", "prev": rec(lines[-1])["h"], "step": 7})
    edited = [*lines, torn[: len(torn) // 2]]
    path = _write(tmp_path, edited, side)
    _expect(path, edited, "PARSE", len(lines), len(lines))
    with AuditLog(path, signing_key=signing_key()) as log:
        assert log.seq == len(lines) + 2  # the closed log is reopened first, then the cut recorded
    recovered = lines_of(path.read_bytes())
    assert rec(recovered[len(lines)])["reopened"] is True
    recovery = rec(recovered[len(lines) + 1])
    assert recovery["kind"] == "recovery"
    assert recovery["cut"]["bytes"] == len(torn) // 2
    assert recovery["cut"]["offset"] == len(data)
    assert recovery["cut"]["line"] == len(lines) + 1
    assert recovery["cut"]["b64"]
    assert verify(path, pubkey=signing_key().public_key()).ok


@pytest.mark.parametrize("position", ["first", "middle"])
@pytest.mark.parametrize("size", [s for s in SIZES if s >= 1])
def test_torn_middle_line_is_fatal(size: int, position: str, templates: Path, tmp_path: Path) -> None:
    """A torn line with records after it is corruption: verify says PARSE and the writer refuses the log."""
    data, side = built(templates, size)
    lines = lines_of(data)
    i = min(_index(len(lines), position), len(lines) - 2)
    edited = list(lines)
    edited[i] = lines[i][: len(lines[i]) // 2] + b"\n"
    path = _write(tmp_path, edited, side)
    _expect(path, edited, "PARSE", i, i)
    with pytest.raises(AuditCorrupted) as caught:
        AuditLog(path, signing_key=signing_key())
    assert (caught.value.seq, caught.value.line, caught.value.offset) == (i, i + 1, offset_of(lines, i))
    assert "line" in str(caught.value) and "PARSE" in str(caught.value)


def _checkpoint_at(lines: list[bytes], position: str) -> int:
    cks = checkpoint_positions(lines)
    return {"first": cks[0], "middle": cks[len(cks) // 2], "last": cks[-1]}[position]


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("size", SIZES)
def test_bad_checkpoint_signature(size: int, position: str, templates: Path, tmp_path: Path) -> None:
    """A checkpoint whose signature was altered (and h recomputed) is CKPT_SIG at that checkpoint."""
    data, side = built(templates, size)
    lines = lines_of(data)
    c = _checkpoint_at(lines, position)
    r = rec(lines[c])
    r["sig"] = ("0" if r["sig"][0] != "0" else "1") + r["sig"][1:]
    edited = rechain([*lines[:c], reseal(r), *lines[c + 1 :]], c + 1)
    _expect(_write(tmp_path, edited, side), edited, "CKPT_SIG", c, c)


@pytest.mark.parametrize("size", SIZES)
def test_wrong_key(size: int, templates: Path, tmp_path: Path) -> None:
    """Pinning another key fails at the first checkpoint."""
    data, side = built(templates, size)
    lines = lines_of(data)
    c = checkpoint_positions(lines)[0]
    _expect(_write(tmp_path, lines, side), lines, "CKPT_SIG", c, c, pubkey=other_key().public_key())


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("size", SIZES)
def test_checkpoint_claiming_more_records_than_exist(
    size: int, position: str, templates: Path, tmp_path: Path
) -> None:
    """A validly signed checkpoint whose size exceeds the records before it is CKPT_ROOT."""
    data, side = built(templates, size)
    lines = lines_of(data)
    c = _checkpoint_at(lines, position)
    r = resign(dict(rec(lines[c]), size=rec(lines[c])["size"] + 5), signing_key())
    edited = rechain([*lines[:c], reseal(r), *lines[c + 1 :]], c + 1)
    path = _write(tmp_path, edited, side)
    _expect(path, edited, "CKPT_ROOT", c, c)
    assert "claims" in str(verify(path).failure)


def test_rechain_without_a_signature_is_caught_by_the_checkpoint_root(templates: Path, tmp_path: Path) -> None:
    """Without a side file, a re-chained middle record is still caught by the next checkpoint's root."""
    data, _ = built(templates, 8)
    lines = lines_of(data)
    edited, code, seq, index = rechain_to_end(lines, 1)
    _expect(_write(tmp_path, edited, None), edited, code, seq, index)


def test_fork_against_a_trusted_checkpoint_of_another_history(templates: Path, tmp_path: Path) -> None:
    """A log of the same length but another history is a FORK at the trusted checkpoint's record."""
    _data, side = built(templates, 5)
    other, _ = built(templates, 5, every=2)
    trusted = tmp_path / "trusted.checkpoint"
    trusted.write_bytes(side)
    lines = lines_of(other)
    path = _write(tmp_path, lines, None)
    report = verify(path, trusted_checkpoint=trusted)
    assert report.failure is not None and report.failure.code == "FORK"


def test_trusted_checkpoint_that_is_itself_tampered(templates: Path, tmp_path: Path) -> None:
    """A trusted checkpoint file whose content was edited is rejected before the log is read."""
    data, side = built(templates, 3)
    trusted = tmp_path / "trusted.checkpoint"
    trusted.write_bytes(side.replace(b'"size":', b'"size": ', 1))
    report = verify(_write(tmp_path, lines_of(data), None), trusted_checkpoint=trusted)
    assert report.failure is not None and report.failure.code == "NONCANONICAL" and report.failure.line is None
