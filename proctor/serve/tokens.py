"""Approver tokens: a file that holds only their hashes.

One approver a line, ``NAME sha256:HEX``. A token is 32 random bytes (URL-safe
base64), so a plain SHA-256 is enough to store it: nothing short enough to guess
ever reaches the file. `proctor serve token NAME --tokens FILE` adds a line and
prints the token once; lose it and add another.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from proctor.errors import ConfigurationError

__all__ = ["TokenFile", "add_token", "hash_token"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@+-]{0,63}")
_LINE = re.compile(r"(?P<name>\S+)\s+sha256:(?P<hex>[0-9a-f]{64})")


def hash_token(token: str) -> str:
    """The form a token is stored in."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenFile:
    """The approvers a server accepts: name → token hash, read once at start."""

    path: Path
    hashes: dict[str, str]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenFile:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigurationError(f"{p}: no such token file: add an approver with "
                                     f"`proctor serve token NAME --tokens {p}`") from None
        except OSError as exc:
            raise ConfigurationError(f"{p}: cannot read the token file: {exc.strerror}") from None
        hashes: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            m = _LINE.fullmatch(line)
            if m is None:
                raise ConfigurationError(f"{p}:{number}:1: expected `NAME sha256:HEX` (a token file stores only "
                                         "hashes; make entries with `proctor serve token`)")
            hashes[m["name"]] = "sha256:" + m["hex"]
        return cls(p, hashes)

    def who(self, token: str) -> str | None:
        """The approver whose token this is, or None. Compares every entry in constant time."""
        digest = hash_token(token)
        found = None
        for name, stored in self.hashes.items():
            if hmac.compare_digest(stored, digest):
                found = name
        return found


def add_token(path: str | os.PathLike[str], name: str) -> str:
    """Add (or replace) `name`'s token in the file, created private (0600); return the new token."""
    if not _NAME.fullmatch(name):
        raise ConfigurationError(f"approver name {name!r}: use letters, digits and _.@+- (at most 64)")
    p = Path(path)
    lines: list[str] = []
    if p.exists():
        TokenFile.load(p)  # refuse to rewrite a file we cannot read back
        lines = [ln for ln in p.read_text(encoding="utf-8").splitlines() if ln.split(" ", 1)[0] != name]
    token = secrets.token_urlsafe(32)
    lines.append(f"{name} {hash_token(token)}")
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return token
