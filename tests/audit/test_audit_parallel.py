"""Parallel verification: the same report as the sequential scan, for intact and tampered logs."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import random
from pathlib import Path

import pytest
from audit_helpers import signing_key
from tiers import examples

from proctor.audit import AuditLog, verify
from proctor.audit.parallel import _check_segment, _segments, _stitch
from proctor.audit.scan import Scanner

# `proctor.audit.verify` the attribute is the function; the module is reached by name.
verify_module = importlib.import_module("proctor.audit.verify")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("parallel") / "big.jsonl"
    with AuditLog(path, signing_key=signing_key(), durability="flush", checkpoint_every=50) as log:
        for i in range(600):
            log.append("call_intent", {"call_id": f"c{i}", "tool": "t", "run_id": "r"})
            if i % 97:
                log.append("call_outcome", {"call_id": f"c{i}", "status": "ok"})
    return path


def _reference(path: Path) -> Scanner:
    scanner = Scanner()
    verify_module.scan_file(path, scanner)
    return scanner


@pytest.mark.parametrize("pieces", [1, 2, 3, 7, 64])
def test_stitched_segments_equal_the_sequential_scan(big: Path, pieces: int) -> None:
    """However the file is cut, stitching the segments gives the same count, head, root and open intents."""
    ref = _reference(big)
    scanner = Scanner()
    lines = 0
    for task in _segments(str(big), os.path.getsize(big), pieces):
        seg = _check_segment(task)
        assert seg.ok and _stitch(scanner, seg, lines)
        lines += seg.lines
    assert (scanner.count, scanner.head, scanner.frontier.root(), scanner.checkpoints) == (
        ref.count, ref.head, ref.frontier.root(), ref.checkpoints)
    assert list(scanner.intents) == list(ref.intents)


@pytest.mark.process
def test_worker_processes_give_the_same_report(big: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify(workers=2) reports exactly what verify() does on an intact log."""
    monkeypatch.setattr(verify_module, "_PARALLEL_MIN", 0)
    assert verify(big, workers=2, pubkey=signing_key().public_key()) == verify(big, pubkey=signing_key().public_key())


@pytest.mark.process
@pytest.mark.parametrize("seed", range(6))
def test_tampered_logs_fall_back_to_the_exact_sequential_report(
    big: Path, tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A damaged log gives the sequential failure (code, seq, line, offset) in parallel mode too."""
    monkeypatch.setattr(verify_module, "_PARALLEL_MIN", 0)
    rng = random.Random(seed)
    lines = big.read_bytes().splitlines(keepends=True)
    i = rng.randrange(len(lines))
    if seed % 3 == 0:
        del lines[i]
    elif seed % 3 == 1:
        lines[i] = lines[i].replace(b'"status":"ok"', b'"status":"no"').replace(b'"tool":"t"', b'"tool":"u"')
    else:
        lines[i], lines[i - 1] = lines[i - 1], lines[i]
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(lines))
    sequential = verify(path, side_file=False)
    assert not sequential.ok
    assert verify(path, side_file=False, workers=2) == sequential


def test_auto_means_one_process_per_usable_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """workers="auto" is the CPUs this process may use, at least 1 and at most 8."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1, 2}, raising=False)
    assert verify_module.auto_workers() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(64)), raising=False)
    assert verify_module.auto_workers() == 8


@pytest.mark.process
def test_auto_gives_the_same_report(big: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verify(workers="auto") reports exactly what verify() does."""
    monkeypatch.setattr(verify_module, "_PARALLEL_MIN", 0)
    monkeypatch.setattr(verify_module, "auto_workers", lambda: 2)
    assert verify(big, workers="auto") == verify(big)


@pytest.mark.process
def test_parallel_progress_climbs_to_the_file_size(big: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In parallel mode the progress callback sees increasing byte counts ending at the file's size."""
    monkeypatch.setattr(verify_module, "_PARALLEL_MIN", 0)
    seen: list[int] = []
    assert verify(big, workers=2, progress=seen.append).ok
    assert seen == sorted(seen) and len(seen) > 1 and seen[-1] == os.path.getsize(big)


def _edits(data: bytes, seed: int) -> list[bytes]:
    """One-byte edits, and records dropped, duplicated, swapped and forged with a correct h (floats too)."""
    rng, out = random.Random(seed), []
    lines = data.splitlines(keepends=True)
    for _ in range(examples(40)):  # random byte edits: as many as a property test's examples
        pos = rng.randrange(len(data))
        out.append(data[:pos] + bytes([rng.randrange(256)]) + data[pos + 1 :])
    for _ in range(examples(20)):  # random forgeries, likewise
        i = rng.randrange(1, len(lines) - 1)
        record = json.loads(lines[i])
        del record["h"]
        record[rng.choice(["seq", "kind", "call_id", "run_id", "n"])] = rng.choice([1.5, 7, "x", None, [1]])
        body = json.dumps(record, sort_keys=True, separators=(",", ":")).encode()
        forged = json.dumps({**record, "h": hashlib.sha256(b"\x00" + body).hexdigest()}, sort_keys=True,
                            separators=(",", ":")).encode() + b"\n"
        out += [b"".join(lines[:i] + lines[i + 1 :]), b"".join([*lines[:i], lines[i], *lines[i:]]),
                b"".join([*lines[:i], lines[i + 1], lines[i], *lines[i + 2 :]]),
                b"".join([*lines[:i], forged, *lines[i + 1 :]])]
    return out


@pytest.mark.parametrize("pieces", [1, 3])
def test_segments_accept_nothing_the_sequential_scan_rejects(big: Path, tmp_path: Path, pieces: int) -> None:
    """Whenever every segment of an edited log is accepted and stitched, the sequential scan agrees on all of it."""
    for k, data in enumerate(_edits(big.read_bytes(), pieces)):
        path = tmp_path / f"e{k}.jsonl"
        path.write_bytes(data)
        tasks = _segments(str(path), len(data), pieces)
        scanner, lines, accepted = Scanner(), 0, tasks is not None
        for task in tasks or []:
            seg = _check_segment(task)
            if not (seg.ok and _stitch(scanner, seg, lines)):
                accepted = False
                break
            lines += seg.lines
        if accepted:
            ref = _reference(path)  # raises ScanFailure if the segments accepted a bad log
            assert (scanner.count, scanner.head, scanner.frontier.root(), scanner.open.intents) == (
                ref.count, ref.head, ref.frontier.root(), ref.open.intents)
