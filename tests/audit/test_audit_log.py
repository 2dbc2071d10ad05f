"""AuditLog as a sink: records, refusals, durability, failures, checkpoints, keys, redaction, locking, threads."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from audit_helpers import signing_key
from cryptography.hazmat.primitives import serialization

import proctor.audit.log as log_module
from proctor.audit import AuditLog, AuditSink, generate_keypair, key_id, merkle_root, verify
from proctor.audit.records import GENESIS, checkpoint_statement
from proctor.errors import AuditError, ConfigurationError

#: A redaction mark's keyed digest (random per key): masked before looking for clear values.
_MARK = re.compile(r"hmac-sha256:[0-9a-f]{64}")


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


def test_is_an_audit_sink_and_writes_canonical_chained_records(tmp_path: Path) -> None:
    """Records are canonical JSON lines with 0-based seq, ts_ns, kind, prev and h = sha256(0x00 ‖ body)."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path) as log:
        assert isinstance(log, AuditSink)
        first = log.append("run_started", {"run_id": "r1", "principal": "alice"})
        second = log.append("call_intent", {"call_id": "c1", "run_id": "r1", "tool": "t", "cost": 1.5})
        assert (first.ok, first.seq, second.seq) == (True, 0, 1)
    raw = path.read_bytes().splitlines()
    recs = _records(path)
    assert recs[0]["prev"] == GENESIS and recs[1]["prev"] == recs[0]["h"]
    assert recs[1]["cost"] == {"$float": "1.5"}  # floats never reach the log as floats
    for line, r in zip(raw, recs, strict=True):
        body = {k: v for k, v in r.items() if k != "h"}
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        assert hashlib.sha256(b"\x00" + canonical).hexdigest() == r["h"]
        assert json.dumps(r, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() == line
        assert isinstance(r["ts_ns"], int)
    assert recs[-1]["kind"] == "checkpoint"  # close seals the log


@pytest.mark.parametrize(
    ("kind", "fields", "needle"),
    [
        ("nonsense", {}, "kind 'nonsense'"),
        ("checkpoint", {}, "kind 'checkpoint'"),
        ("recovery", {}, "kind 'recovery'"),
        ("step", {"seq": 4}, "seq"),
        ("step", {"h": "x", "prev": "y"}, "prev, h"),
        ("call_intent", {"tool": "t"}, "call_id"),
        ("call_outcome", {"call_id": "c", "status": "maybe"}, "status"),
        ("step", {"bad": object()}, "cannot encode"),
    ],
)
def test_refused_appends_return_a_reason_and_write_nothing(
    tmp_path: Path, kind: str, fields: dict[str, Any], needle: str
) -> None:
    """A bad append returns ok=False naming the problem, and the log keeps working."""
    with AuditLog(tmp_path / "a.jsonl") as log:
        result = log.append(kind, fields)
        assert not result.ok and result.error is not None and needle in result.error
        assert log.seq == 0 and log.error is None
        assert log.append("step", {"step": 1}).ok


def test_a_failed_write_fails_the_log_and_every_later_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Disk full on write: ok=False with the reason, the log marks itself failed, nothing is dropped silently."""
    path = tmp_path / "a.jsonl"
    log = AuditLog(path)
    assert log.append("step", {"step": 0}).ok

    def full(fd: int, data: bytes) -> None:
        os.write(fd, data[:10])  # a partial line reaches the file before the error
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log_module, "write_all", full)
    result = log.append("call_intent", {"call_id": "c1", "tool": "t"})
    assert not result.ok and "No space left" in str(result.error)
    monkeypatch.undo()
    later = log.append("step", {"step": 2})
    assert not later.ok and "failed earlier" in str(later.error)
    log.close()
    assert len(_records(path)) == 1  # the partial line was cut back; no checkpoint over a failed log
    assert verify(path).ok


def test_a_failed_fsync_fails_the_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EIO from fsync is a failed append: the intent is not known to be durable, so the call must not run."""
    with AuditLog(tmp_path / "a.jsonl") as log:
        def eio(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(log_module, "sync_fd", eio)
        result = log.append("call_intent", {"call_id": "c1", "tool": "t"})
        assert not result.ok and "Input/output error" in str(result.error)
        assert log.error is not None


def test_closed_log_refuses_appends(tmp_path: Path) -> None:
    """Appending after close returns ok=False; closing twice is harmless."""
    log = AuditLog(tmp_path / "a.jsonl")
    log.close()
    log.close()
    result = log.append("step", {})
    assert not result.ok and "closed" in str(result.error)


def test_durability_fsync_flush_and_the_durable_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync per durable append; durable=False only flushes; durability='flush' fsyncs only checkpoints."""
    calls: list[int] = []
    real = log_module.sync_fd
    monkeypatch.setattr(log_module, "sync_fd", lambda fd: (calls.append(fd), real(fd))[1])
    with AuditLog(tmp_path / "a.jsonl", checkpoint_every=100) as log:
        log.append("step", {})
        assert len(calls) == 1
        log.append("call_outcome", {"call_id": "c", "status": "ok"}, durable=False)
        assert len(calls) == 1
    with AuditLog(tmp_path / "b.jsonl", durability="flush", checkpoint_every=100) as log:
        calls.clear()
        log.append("step", {})
        assert calls == []
        log.checkpoint()
        assert len(calls) == 1
    with pytest.raises(ValueError, match="durability"):
        AuditLog(tmp_path / "c.jsonl", durability="sometimes")


def test_checkpoints_every_n_records_every_t_seconds_and_on_close(tmp_path: Path) -> None:
    """A checkpoint precedes the (N+1)th record, follows an idle interval, and seals the log on close."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path, signing_key=signing_key(), checkpoint_every=2, checkpoint_interval_s=3600) as log:
        for i in range(5):
            log.append("step", {"step": i})
    kinds = [r["kind"] for r in _records(path)]
    assert kinds == ["step", "step", "checkpoint", "step", "step", "checkpoint", "step", "checkpoint"]
    path2 = tmp_path / "b.jsonl"
    with AuditLog(path2, checkpoint_every=1000, checkpoint_interval_s=0.05) as log:
        log.append("step", {})
        time.sleep(0.06)
        log.append("step", {})
    assert [r["kind"] for r in _records(path2)] == ["step", "checkpoint", "step", "checkpoint"]


def test_checkpoint_contents_side_file_and_signature(tmp_path: Path) -> None:
    """A checkpoint holds size, head, RFC 6962 root, key id and a signed statement; the side file is a copy."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path, signing_key=signing_key()) as log:
        for i in range(6):
            log.append("step", {"step": i})
        root = log.root()
    recs = _records(path)
    ckpt = recs[-1]
    leaves = [bytes.fromhex(r["h"]) for r in recs[:-1]]
    assert ckpt["size"] == 6 == ckpt["seq"]
    assert ckpt["head"] == recs[-2]["h"]
    assert ckpt["root"] == merkle_root(leaves).hex() == root
    assert ckpt["key_id"] == key_id(signing_key())
    assert ckpt["closed"] is True  # the checkpoint close() seals with says so, under the signature
    statement = checkpoint_statement(ckpt["log"], 6, ckpt["head"], ckpt["root"], ckpt["ts_ns"], closed=True)
    signing_key().public_key().verify(bytes.fromhex(ckpt["sig"]), statement)
    side = Path(str(path) + ".checkpoint")
    assert side.read_bytes() == path.read_bytes().splitlines(keepends=True)[-1]
    assert not list(tmp_path.glob(".*.tmp"))


def test_unsigned_checkpoints_are_written_and_verify_says_so(tmp_path: Path) -> None:
    """Without a key, checkpoints are still written, and verify warns they are unsigned."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path) as log:
        log.append("step", {})
    ckpt = _records(path)[-1]
    assert ckpt["kind"] == "checkpoint" and ckpt["sig"] is None and ckpt["key_id"] is None
    report = verify(path)
    assert report.ok and any("unsigned" in w for w in report.warnings)
    assert verify(path, pubkey=signing_key().public_key()).failure.code == "CKPT_SIG"  # type: ignore[union-attr]


def test_reopening_continues_seq_chain_and_merkle_tree(tmp_path: Path) -> None:
    """A reopened log continues seq and prev, and its root covers every record ever written."""
    path = tmp_path / "a.jsonl"
    for round_ in range(3):
        with AuditLog(path, signing_key=signing_key(), checkpoint_every=4) as log:
            for i in range(5):
                assert log.append("step", {"round": round_, "step": i}).ok
            root = log.root()
    recs = _records(path)
    assert [r["seq"] for r in recs] == list(range(len(recs)))
    assert root == merkle_root([bytes.fromhex(r["h"]) for r in recs[:-1]]).hex()
    assert len({r["log"] for r in recs if r["kind"] == "checkpoint"}) == 1  # one log id for the log's life
    assert verify(path, pubkey=signing_key().public_key()).ok
    with AuditLog(path, signing_key=signing_key()):
        pass
    assert len(_records(path)) == len(recs)  # reopening a sealed log and closing it adds nothing


@pytest.mark.parametrize("form", ["object", "raw", "pem", "pem_path", "raw_path", "keygen_path"])
def test_signing_key_forms(tmp_path: Path, form: str) -> None:
    """A signing key may be a key object, raw or PEM bytes, or a path to a PEM or raw key file."""
    key = signing_key()
    raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                            serialization.NoEncryption())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    expected = key_id(key)
    source: Any = {"object": key, "raw": raw, "pem": pem}.get(form)
    if form == "pem_path":
        source = tmp_path / "k.pem"
        source.write_bytes(pem)
    elif form == "raw_path":
        source = str(tmp_path / "k.raw")
        Path(source).write_bytes(raw)
    elif form == "keygen_path":
        source, _pub, expected = generate_keypair(tmp_path / "gen")
        assert stat.S_IMODE(os.stat(source).st_mode) == 0o600
    with AuditLog(tmp_path / "a.jsonl", signing_key=source) as log:
        assert log.key_id == expected


def test_bad_signing_key_is_an_audit_error(tmp_path: Path) -> None:
    """An unusable key is refused at construction with a one-line reason."""
    with pytest.raises(AuditError, match="Ed25519"):
        AuditLog(tmp_path / "a.jsonl", signing_key=b"short")
    with pytest.raises(AuditError, match="cannot read key file"):
        AuditLog(tmp_path / "a.jsonl", signing_key=tmp_path / "missing.key")


def test_unopenable_log_is_an_audit_error(tmp_path: Path) -> None:
    """A log path that cannot be opened for writing (here a directory) is a one-line AuditError."""
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(AuditError, match="cannot open the audit log"):
        AuditLog(tmp_path / "dir.jsonl")
    with AuditLog(tmp_path / "ok.jsonl") as log:  # and nothing was left locked
        assert log.append("step", {}).ok


def test_a_url_is_refused_as_a_path_and_nothing_is_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`AuditLog("postgresql://…?log=prod")` would write the fleet's trail to a local `postgresql:/…` file that no
    reader of the database sees: it is refused, naming what opens a URL, and no file or directory is made."""
    monkeypatch.chdir(tmp_path)
    for url in ("postgresql://auditor:s3cret@db/proctor?log=prod", "file://audit.jsonl"):
        with pytest.raises(ConfigurationError, match=r"AuditLog takes a file path, not the URL .*PostgresAuditLog"
                                                     r"\(URL\).*open_audit\(URL\)") as caught:
            AuditLog(url)
        assert "s3cret" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_url_made_a_path_object_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`Path("postgresql://…")` folds the `//` into one slash: `AuditLog(Path(url))` (a URL from the environment
    made a Path) wrote the same local `postgresql:/…` file. It is refused as the URL it was, its password masked."""
    monkeypatch.chdir(tmp_path)
    for url in ("postgresql://auditor:s3cret@db/proctor?log=prod", "postgres://auditor:s3cret@db/proctor",
                "file:///var/log/audit.jsonl"):
        with pytest.raises(ConfigurationError, match=r"AuditLog takes a file path, not the URL") as caught:
            AuditLog(Path(url))
        assert "s3cret" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []
    with AuditLog(tmp_path / "postgresql-audit.jsonl") as log:  # a file merely named after it is a path
        assert log.append("step", {}).ok


def test_redaction_is_keyed_per_log_and_correlates_within_a_log(tmp_path: Path) -> None:
    """Equal values give equal digests within a log, different ones across logs; the key file is private."""
    with AuditLog(tmp_path / "a.jsonl") as a, AuditLog(tmp_path / "b.jsonl") as b:
        one = a.redact({"card": "4111111111111111", "amount": 5}, ["card"])
        two = a.redact({"card": "4111111111111111", "amount": 7}, ["card"])
        other = b.redact({"card": "4111111111111111", "amount": 5}, ["card"])
    assert one.args["card"] == two.args["card"] != other.args["card"]
    # The keyed digest is random hex that may hold "4111" by chance (about 1 run in 1,000): look past it.
    assert "4111" not in _MARK.sub("", json.dumps(one.args)) and one.args["amount"] == 5
    assert one.digest != other.digest
    key_file = tmp_path / "a.jsonl.redact-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    with AuditLog(tmp_path / "a.jsonl") as again:
        assert again.redact({"card": "4111111111111111"}, ["card"]).args["card"] == one.args["card"]


@pytest.mark.process
def test_second_writer_is_refused_in_process_and_across_processes(tmp_path: Path) -> None:
    """A second writer gets AuditError naming the holder's pid, until the first closes."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path):
        with pytest.raises(AuditError, match=rf"locked by another writer \(pid {os.getpid()}\)"):
            AuditLog(path)
        code = (
            "import sys\nfrom proctor.audit import AuditLog\nfrom proctor.errors import AuditError\n"
            f"try:\n    AuditLog({str(path)!r})\nexcept AuditError as e:\n    print(e); sys.exit(3)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 3 and f"pid {os.getpid()}" in proc.stdout
    with AuditLog(path) as log:  # released on close
        assert log.append("step", {}).ok


def test_many_threads_keep_one_valid_chain(tmp_path: Path) -> None:
    """Concurrent appends from many threads produce one gap-free, verifiable chain."""
    path = tmp_path / "a.jsonl"
    seqs: list[int] = []
    with AuditLog(path, durability="flush", checkpoint_every=17) as log:
        def work(t: int) -> None:
            for i in range(40):
                r = log.append("call_intent", {"call_id": f"{t}-{i}", "tool": "t"}, durable=False)
                assert r.ok and r.seq is not None
                seqs.append(r.seq)
                assert log.append("call_outcome", {"call_id": f"{t}-{i}", "status": "ok"}).ok

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    report = verify(path)
    assert report.ok, report.failure
    assert len(set(seqs)) == 320 and report.dangling_intents == []
    assert sum(1 for r in _records(path) if r["kind"] != "checkpoint") == 640


@pytest.mark.process
def test_a_log_left_open_is_sealed_at_exit(tmp_path: Path) -> None:
    """A program that never calls close() still ends its log with a checkpoint."""
    import subprocess
    import sys

    from proctor.audit import verify

    log = tmp_path / "audit.jsonl"
    program = (
        "from proctor.audit import AuditLog\n"
        f"log = AuditLog({str(log)!r})\n"
        "log.append('step', {'n': 1})\n"
    )
    subprocess.run([sys.executable, "-c", program], check=True, timeout=60)
    lines = log.read_text().splitlines()
    assert '"kind":"checkpoint"' in lines[-1]
    assert verify(log).ok
