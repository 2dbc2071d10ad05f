"""Red team: a disk whose writeback fails (fsync reports an I/O error): the audit log fails closed, nothing hangs.

The log lives on an ext4 file system in a loop device whose backing file sits on a small tmpfs with a
fixed 512 KiB left free: the file system has room, so every write() succeeds into the page cache, but
writeback to the device fails once the tmpfs is full, and fsync reports it (the "fsyncgate" case: a
second fsync on the same descriptor then succeeds although the data is gone). After the failure the
file system is mounted afresh and read from the device: every tool that ran must find its intent there.

The set-up is one whose semantics the test can rely on (last session's lost fdatasynced bytes 2-3 runs
in 10 below proctor: a plain write+fdatasync loop lost them too): ext4 with 4 KiB blocks and its journal
written out in full (journal writes never need a new tmpfs page; what an fsync returned 0 for is
committed), and a loop device that takes one page per request (see `make`).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from proctor.audit import AuditLog, verify
from proctor.errors import ProctorError
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.tools import tool


def _sh(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()} "
                           "(this test needs root: mount, losetup, mkfs.ext4)")
    return done.stdout.strip()


class _FailingDisk:
    """Journalled ext4 on a loop device over a file on a tmpfs with 512 KiB free: writeback fails once that fills."""

    FREE = 512 * 1024

    def __init__(self, root: Path) -> None:
        self.small, self.mnt = root / "small", root / "mnt"
        self.small.mkdir()
        self.mnt.mkdir()
        self.image = self.small / "image"
        self.loop = ""

    def make(self) -> None:
        _sh("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(self.small))
        _sh("truncate", "-s", "64M", str(self.image))
        # The journal written out in full (no hole punched for it): its writes never need a new tmpfs page,
        # so it is the log's data writeback that fails, and the journal keeps committing afterwards.
        _sh("env", "UNIX_IO_NOZEROOUT=1", "mkfs.ext4", "-q", "-F", "-b", "4096",
            "-E", "lazy_itable_init=1,lazy_journal_init=0", str(self.image))
        self.loop = _sh("losetup", "-f", "--show", str(self.image))
        # One page per request: the loop driver writes a request's pages one by one and reports the whole
        # request failed when a later page finds the tmpfs full, and ext4 then leaves the earlier pages'
        # blocks unconverted (read back as zeros) although an fsync had returned 0 for them: with bigger
        # requests a plain write+fdatasync loop, no proctor in it, lost fdatasynced records 2 runs in 12.
        Path(f"/sys/block/{Path(self.loop).name}/queue/max_sectors_kb").write_text("4")
        self.mount()
        # What mkfs and the mount allocated in the tmpfs varies with e2fsprogs' zeroing: fill it up to a
        # fixed free space, so the disk fails after the same amount of writeback every run.
        st = os.statvfs(self.small)
        filler = st.f_bavail * st.f_frsize - self.FREE
        assert filler > 0, f"the tmpfs under the image has only {st.f_bavail * st.f_frsize} bytes free"
        fd = os.open(self.small / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, filler)
        finally:
            os.close(fd)

    def mount(self) -> None:
        _sh("mount", "-o", "errors=continue,data=ordered", self.loop, str(self.mnt))

    def remount_with_room(self) -> None:
        """Unmount (dropping the page cache), give the backing store room, mount again: reads come from the device."""
        subprocess.run(["umount", str(self.mnt)], capture_output=True, timeout=60, check=False)
        (self.small / "filler").unlink()
        self.mount()

    def remove(self) -> None:
        subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True, timeout=60, check=False)
        if self.loop:
            subprocess.run(["losetup", "-d", self.loop], capture_output=True, timeout=60, check=False)
        subprocess.run(["umount", "-l", str(self.small)], capture_output=True, timeout=60, check=False)


@pytest.fixture
def failing_disk(tmp_path: Path) -> Iterator[_FailingDisk]:
    disk = _FailingDisk(tmp_path)
    try:
        disk.make()
        yield disk
    finally:
        disk.remove()


@pytest.mark.process
def test_failed_writeback_refuses_every_later_call_and_every_effect_has_its_intent_on_disk(
        failing_disk: _FailingDisk) -> None:
    """fsync failing under 4 gate threads: later calls are refused, close() returns, effects' intents are on disk."""
    path = failing_disk.mnt / "audit.jsonl"
    log = AuditLog(path, checkpoint_every=40)
    effects: list[int] = []
    lock = threading.Lock()
    counter = iter(range(1_000_000))
    after_failure: list[str] = []

    @tool(side_effect="write")
    def effect(n: int, pad: str) -> int:
        """Change the world.

        Args:
            n: Which call.
            pad: Bytes to fill the disk with.
        """
        with lock:
            effects.append(n)
        return n

    gate = Gate(Policy.from_string("version: 1\ndefault: allow\n"), audit=log, tools=[effect])

    def worker() -> None:
        ctx = gate.start_run(task="t")
        refused = 0
        for _ in range(2000):
            with lock:
                n = next(counter)
            out = gate.submit("effect", {"n": n, "pad": "p" * 3000}, context=ctx)
            if out.record.status != "ok":
                refused += 1
            elif refused:  # once a call was refused for the log, nothing may run any more
                after_failure.append(f"call {n} ran after a refusal")
            if refused >= 5:
                return

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a gate thread hung on the failing disk"
    assert log.error, "the log never noticed its writes did not reach the disk"
    closer = threading.Thread(target=log.close)
    closer.start()
    closer.join(timeout=60)
    assert not closer.is_alive(), "close() hung on a failed log"
    assert after_failure == []
    assert effects, "no call ran before the disk failed"

    failing_disk.remount_with_room()
    on_disk = path.read_bytes()
    missing = [n for n in effects if b'"args":{"n":%d,' % n not in on_disk]
    assert missing == [], f"{len(missing)} of {len(effects)} tools ran without their intent on disk"
    try:  # reopened with room: either refused as damaged, or recovered into a log that verifies
        AuditLog(path).close()
    except ProctorError:
        return
    report = verify(path)
    assert report.ok, report.failure
