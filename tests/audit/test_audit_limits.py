"""Hostile files and paths against the audit trail: one writer per file identity, bounded line reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.audit import AuditLog
from proctor.audit.follow import follow, last_lines
from proctor.audit.lines import MAX_LINE_BYTES, LongLine
from proctor.audit.verify import verify
from proctor.cli import main
from proctor.errors import AuditCorrupted, AuditError

_HUGE = 300 << 20


def _aliases(tmp_path: Path, log: Path) -> dict[str, Path]:
    """Other names for `log`: a symlink, a symlink to its directory, a hard link, a `..` path."""
    other = tmp_path / "b"
    other.mkdir()
    (other / "alias.jsonl").symlink_to(log)
    (tmp_path / "dirlink").symlink_to(log.parent, target_is_directory=True)
    os.link(log, other / "hard.jsonl")
    return {
        "symlink": other / "alias.jsonl",
        "dir symlink": tmp_path / "dirlink" / log.name,
        "hard link": other / "hard.jsonl",
        "dotdot": other / ".." / log.parent.name / "." / log.name,
    }


def test_second_writer_by_another_name_is_refused_in_process(tmp_path: Path) -> None:
    """A symlink, hard link or `..` path to an open log cannot open a second writer in the same process."""
    (tmp_path / "a").mkdir()
    log_path = tmp_path / "a" / "audit.jsonl"
    with AuditLog(log_path) as log:
        assert log.append("step", {"n": 1}).ok
        for name, alias in _aliases(tmp_path, log_path).items():
            with pytest.raises(AuditError, match=rf"locked by another writer \(pid {os.getpid()}\)"):
                AuditLog(alias)
            assert log.append("step", {"after": name}).ok  # the holder is unaffected
    assert verify(log_path).ok


@pytest.mark.process
def test_second_writer_by_another_name_is_refused_across_processes(tmp_path: Path) -> None:
    """Another process opening the log by any alias is refused and names the holder's pid."""
    (tmp_path / "a").mkdir()
    log_path = tmp_path / "a" / "audit.jsonl"
    with AuditLog(log_path):
        for alias in _aliases(tmp_path, log_path).values():
            code = (
                "import sys\nfrom proctor.audit import AuditLog\nfrom proctor.errors import AuditError\n"
                f"try:\n    AuditLog({str(alias)!r})\nexcept AuditError as e:\n    print(e); sys.exit(3)\n"
                "sys.exit(0)\n"
            )
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            assert proc.returncode == 3, proc.stdout + proc.stderr
            assert f"pid {os.getpid()}" in proc.stdout


def test_interleaving_through_aliases_cannot_happen(tmp_path: Path) -> None:
    """The issue's attack: writer A on the log, writer B on a link to it; B never gets to append."""
    (tmp_path / "a").mkdir()
    log_path = tmp_path / "a" / "audit.jsonl"
    with AuditLog(log_path) as a:
        a.append("step", {"n": 0})
        aliases = _aliases(tmp_path, log_path)
        opened = []
        for alias in aliases.values():
            try:
                opened.append(AuditLog(alias))
            except AuditError:
                pass
        assert opened == []
        for i in range(1, 5):
            assert a.append("step", {"n": i}).ok
    report = verify(log_path)
    assert report.ok and report.records == 6


def test_lock_follows_the_file_and_is_released_on_close(tmp_path: Path) -> None:
    """After close any alias can write; a dangling symlink creates and locks its target."""
    target = tmp_path / "target.jsonl"
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)  # dangling: the log does not exist yet
    with AuditLog(link) as first:
        assert target.exists()
        assert first.append("step", {}).ok
        with pytest.raises(AuditError, match="locked by another writer"):
            AuditLog(target)
    with AuditLog(target) as second:  # released on close
        assert second.append("step", {}).ok
    assert verify(target).ok
    assert not (tmp_path / "target.jsonl.lock").exists()


def test_a_refused_writer_leaves_the_holder_and_file_alone(tmp_path: Path) -> None:
    """A refused second open writes nothing, truncates nothing and keeps no descriptor."""
    path = tmp_path / "a.jsonl"
    with AuditLog(path) as log:
        log.append("step", {"x": 1})
        before = path.read_bytes()
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(20):
            with pytest.raises(AuditError):
                AuditLog(tmp_path / "." / "a.jsonl")
        assert len(os.listdir("/proc/self/fd")) == fds
        assert path.read_bytes() == before


def _log_with_records(path: Path, n: int = 3) -> bytes:
    with AuditLog(path, durability="flush", checkpoint_every=10_000) as log:
        for i in range(n):
            log.append("step", {"i": i})
    return path.read_bytes()


def _append_huge_line(path: Path, size: int = _HUGE, newline: bool = True) -> None:
    """Append one `size`-byte line without materialising it (the file is sparse: NUL bytes)."""
    with path.open("r+b") as f:
        end = f.seek(0, os.SEEK_END)
        f.truncate(end + size)
        if newline:
            f.seek(end + size)
            f.write(b"\n")


def _max_rss_mib(code: str) -> tuple[int, str]:
    """Run `code` in a fresh interpreter; return its peak RSS in MiB and its output."""
    # VmHWM belongs to this process image (ru_maxrss would carry the forking parent's peak across exec).
    script = code + ("\nfor row in open('/proc/self/status'):\n    if row.startswith('VmHWM:'):\n"
                     "        print('RSS', int(row.split()[1]) // 1024)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rss = int(proc.stdout.rsplit("RSS", 1)[1])
    return rss, proc.stdout


@pytest.mark.process
@pytest.mark.parametrize("workers", [1, 4])
def test_verify_refuses_a_300mb_line_with_bounded_memory(tmp_path: Path, workers: int) -> None:
    """`audit verify` names the over-long line (seq, line, offset) and stays far below its size in memory."""
    path = tmp_path / "audit.jsonl"
    good = _log_with_records(path)
    _append_huge_line(path)
    code = (
        "from proctor.cli import main\n"
        f"rc = main(['audit', 'verify', {str(path)!r}, '--workers', '{workers}'])\n"
        "print('RC', rc)\n"
    )
    rss, out = _max_rss_mib(code)
    assert "RC 1" in out and "PARSE at seq 4, line 5" in out and f"byte offset {len(good)}" in out, out
    assert "line limit" in out
    assert rss < 200, f"verify of a 300 MB line peaked at {rss} MiB"


def test_the_over_long_line_is_reported_where_it_is(tmp_path: Path) -> None:
    """A long line in the middle is the first failure; earlier damage is still reported first."""
    path = tmp_path / "audit.jsonl"
    good = _log_with_records(path)
    _append_huge_line(path, MAX_LINE_BYTES + 1)
    with path.open("ab") as f:
        f.write(good.splitlines(keepends=True)[0])
    report = verify(path, side_file=False)
    assert report.failure is not None
    assert (report.failure.code, report.failure.line, report.failure.offset) == ("PARSE", 5, len(good))
    assert report.records == 4
    # A line exactly at the limit is read and judged as a record (here: not JSON), not as too long.
    path2 = tmp_path / "at-limit.jsonl"
    _log_with_records(path2)
    _append_huge_line(path2, MAX_LINE_BYTES)
    f2 = verify(path2, side_file=False).failure
    assert f2 is not None and f2.code == "PARSE" and "line limit" not in f2.message


def test_reopening_a_log_with_a_huge_last_line_refuses_without_reading_it(tmp_path: Path) -> None:
    """A huge unterminated last line is corruption, not a torn append: AuditLog refuses and cuts nothing."""
    path = tmp_path / "audit.jsonl"
    _log_with_records(path)
    _append_huge_line(path, 64 << 20, newline=False)
    size = path.stat().st_size
    with pytest.raises(AuditCorrupted, match="line limit"):
        AuditLog(path)
    assert path.stat().st_size == size


def test_the_writer_refuses_a_record_over_the_line_limit(tmp_path: Path) -> None:
    """A record longer than readers accept is refused (not written), and the log stays usable."""
    path = tmp_path / "audit.jsonl"
    with AuditLog(path) as log:
        r = log.append("call_intent", {"call_id": "c1", "tool": "t", "args": {"x": "a" * (MAX_LINE_BYTES + 10)}})
        assert not r.ok and r.error is not None and "line limit" in r.error
        assert log.error is None and log.append("step", {}).ok
    report = verify(path)
    assert report.ok and report.records == 2


@pytest.mark.process
def test_show_and_tail_skip_a_huge_line_with_bounded_memory(tmp_path: Path) -> None:
    """`audit show` counts the long line as unreadable (exit 1) and `audit tail` marks it, without holding it."""
    path = tmp_path / "audit.jsonl"
    _log_with_records(path)
    _append_huge_line(path)
    with path.open("ab") as f:
        f.write(b'{"kind":"step","seq":99}\n')
    for command in (["audit", "show", str(path)], ["audit", "tail", str(path), "-n", "3"]):
        code = f"from proctor.cli import main\nprint('RC', main({command!r}))\n"
        rss, out = _max_rss_mib(code)
        expected = "RC 1" if command[1] == "show" else "RC 0"  # show exits 1 when it skipped unreadable lines
        assert expected in out and rss < 200, (command, rss)
        if command[1] == "tail":
            assert f"a {_HUGE}-byte line" in out and "99" in out


def test_last_lines_and_follow_return_long_lines_as_markers(tmp_path: Path) -> None:
    """The tail readers yield a LongLine for an over-limit line and the lines around it intact."""
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"one\n" + b"x" * 100 + b"\nthree\n")
    lines, done = last_lines(path, 5, limit=50)
    assert lines == [b"one", LongLine(4, 100), b"three"] and done == path.stat().st_size
    seen: list[object] = []
    follow(path, seen.append, last=1, limit=50)
    assert seen == [b"three"]
    # Following: a long line arriving in pieces is skipped whole, the next one arrives intact.
    grown: list[object] = []
    with path.open("ab") as f:
        f.write(b"y" * 80)
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        if calls["n"] == 3:
            with path.open("ab") as f:
                f.write(b"y" * 80 + b"\nfive\n")
        return calls["n"] > 8

    follow(path, grown.append, last=0, keep_following=True, poll_s=0.01, stop=stop, limit=50)
    assert grown == [LongLine(path.stat().st_size - 166, 160), b"five"]


def test_show_counts_a_deeply_nested_line_as_unreadable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A line of 1 MB of '[' is an unreadable line for `audit show`, not a RecursionError traceback."""
    path = tmp_path / "audit.jsonl"
    _log_with_records(path)
    with path.open("ab") as f:
        f.write(b"[" * 1_000_000 + b"\n")
    assert main(["audit", "show", str(path)]) == 1  # records shown; the skipped line makes it exit 1
    assert "1 unreadable line" in capsys.readouterr().err
    assert main(["audit", "verify", str(path), "--no-side-file"]) == 1
    assert "PARSE at seq 4, line 5" in capsys.readouterr().out
