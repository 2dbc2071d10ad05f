"""Approver tokens: a file that holds only their hashes.

One approver a line, ``NAME sha256:HEX [groups=GROUP,GROUP…]``. A token is 32 random
bytes (URL-safe base64), so a plain SHA-256 is enough to store it: nothing short enough to
guess ever reaches the file. `proctor serve token NAME --tokens FILE [--groups a,b]` adds a
line and prints the token once; lose it and add another. The groups are what a policy's
`approvers: {groups: […]}` is checked against, by the inbox when an answer comes in and by
the gate (when the policy names this file as `approval.tokens`) when it judges the answer.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import threading
from pathlib import Path

from proctor.errors import ConfigurationError
from proctor.telemetry.logging import get_logger

__all__ = ["TokenFile", "add_token", "hash_token"]

log = get_logger("proctor.serve")

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}")
_GROUP = r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}"
_LINE = re.compile(r"(?P<name>\S+)\s+sha256:(?P<hex>[0-9a-f]{64})(?:\s+groups=(?P<groups>" + _GROUP
                   + r"(?:," + _GROUP + r")*))?")


def hash_token(token: str) -> str:
    """The form a token is stored in."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


class TokenFile:
    """The approvers a server accepts: name → token hash, as the file says *now*.

    The file is looked at (one ``stat``) on every use and read again when it changed, so a
    token replaced with `proctor serve token NAME` or a line removed stops working at the
    next request, and so do the sessions it opened (`fingerprint` changes). A file that
    becomes unreadable or malformed admits nobody until it is fixed: the server fails
    closed, and `problem` says why.
    """

    def __init__(self, path: Path, hashes: dict[str, str], stamp: tuple[int, int, int, int] | None = None,
                 groups: dict[str, tuple[str, ...]] | None = None) -> None:
        self.path = path
        self._hashes = dict(hashes)
        self._groups = dict(groups or {})
        self._stamp = stamp
        self._lock = threading.Lock()
        self.problem: str | None = None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenFile:
        """Read the file; `ConfigurationError` naming the line when it cannot be used (the server does not start)."""
        p = Path(path)
        stamp = _stamp(p)
        hashes, groups = _read(p)
        return cls(p, hashes, stamp, groups)

    @property
    def hashes(self) -> dict[str, str]:
        """Name → stored hash, re-read first if the file changed."""
        self._refresh()
        return dict(self._hashes)

    @property
    def groups(self) -> dict[str, tuple[str, ...]]:
        """Name → the approver's groups (``groups=`` on its line), re-read first if the file changed."""
        self._refresh()
        return dict(self._groups)

    def fingerprint(self, name: str) -> str | None:
        """`name`'s current token hash (a session remembers it: another value means the token was replaced)."""
        self._refresh()
        return self._hashes.get(name)

    def who(self, token: str) -> str | None:
        """The approver whose token this is, or None. Compares every entry in constant time."""
        self._refresh()
        digest = hash_token(token)
        found = None
        for name, stored in self._hashes.items():
            if hmac.compare_digest(stored, digest):
                found = name
        return found

    def _refresh(self) -> None:
        try:
            stamp: tuple[int, int, int, int] | None = _stamp(self.path)
        except ConfigurationError:
            stamp = None
        with self._lock:
            if stamp is not None and stamp == self._stamp:
                return
            try:
                hashes, groups = _read(self.path)
            except ConfigurationError as exc:
                if self.problem != str(exc):
                    log.error("token_file_unusable", path=str(self.path), error=str(exc))
                self._hashes, self._groups, self._stamp, self.problem = {}, {}, None, str(exc)
                return
            if hashes != self._hashes:
                log.info("token_file_reloaded", path=str(self.path), approvers=len(hashes))
            self._hashes, self._groups, self._stamp, self.problem = hashes, groups, stamp, None


def _stamp(p: Path) -> tuple[int, int, int, int]:
    """What changes when the file is rewritten or replaced (inode, size, mtime, ctime)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConfigurationError(f"{p}: no such token file: add an approver with "
                                 f"`proctor serve token NAME --tokens {p}`") from None
    except OSError as exc:
        raise ConfigurationError(f"{p}: cannot read the token file: {exc.strerror}") from None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _read(p: Path) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigurationError(f"{p}: no such token file: add an approver with "
                                 f"`proctor serve token NAME --tokens {p}`") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{p}: cannot read the token file: {getattr(exc, 'strerror', None) or exc}"
                                 ) from None
    hashes: dict[str, str] = {}
    groups: dict[str, tuple[str, ...]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.fullmatch(line)
        if m is None:
            raise ConfigurationError(f"{p}:{number}:1: expected `NAME sha256:HEX [groups=a,b]` (a token file "
                                     "stores only hashes; make entries with `proctor serve token`)")
        hashes[m["name"]] = "sha256:" + m["hex"]
        groups[m["name"]] = tuple(m["groups"].split(",")) if m["groups"] else ()
    return hashes, groups


def add_token(path: str | os.PathLike[str], name: str, groups: tuple[str, ...] = ()) -> str:
    """Add (or replace) `name`'s token (in `groups`) in the file, created private (0600); return the new token."""
    if not _NAME.fullmatch(name):
        raise ConfigurationError(f"approver name {name!r}: use letters, digits and _.@+- (at most 64)")
    bad = [g for g in groups if not re.fullmatch(_GROUP, g)]
    if bad:
        raise ConfigurationError(f"group name {bad[0]!r}: use letters, digits and _.@+- (at most 64)")
    p = Path(path)
    lines: list[str] = []
    if p.exists():
        TokenFile.load(p)  # refuse to rewrite a file we cannot read back
        lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.split(" ", 1)[0] != name]
    token = secrets.token_urlsafe(32)
    lines.append(f"{name} {hash_token(token)}" + (f" groups={','.join(groups)}" if groups else ""))
    # Written aside and renamed over the file: a server reading it meanwhile sees the old file or
    # the new one, never half of one (which would admit nobody for a moment).
    tmp = p.with_name(f".{p.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return token
