"""Who is asking: bearer tokens, login sessions, a trusted proxy header; and CSRF for forms.

- ``Authorization: Bearer TOKEN`` (the API, `proctor approvals --server`): checked against
  the token file's hashes on every request. Not ambient, so it needs no CSRF token.
- A session: the login form takes a token and sets ``proctor_session`` (HttpOnly,
  SameSite=Strict, Secure over https). Sessions live in the server's memory (a restart
  logs everyone out) and expire after `SESSION_TTL_S`. Every unsafe request made with a
  session must carry the session's CSRF token (form field ``csrf`` or header
  ``X-CSRF-Token``).
- A reverse proxy's user header (``--trust-proxy-header X-Forwarded-User``), only when
  enabled: the proxy authenticates.

A session remembers the hash of the token it was opened with: when that token is replaced
or removed from the token file (which is re-read when it changes), the session ends at
its next request.

The client's address is the peer's, or behind `trusted_proxies` reverse proxies the entry
of ``X-Forwarded-For`` that the outermost trusted proxy wrote: the N-th from the right.
Entries left of it were written by the client and prove nothing.

Any unsafe request whose ``Origin`` (or ``Sec-Fetch-Site``) says it came from another
site is refused, whatever it carries.
"""

from __future__ import annotations

import hmac
import secrets
import threading
import time
from dataclasses import dataclass

from starlette.requests import Request

from proctor.approval.tokens import TokenFile

__all__ = ["COOKIE", "SESSION_TTL_S", "Identity", "Sessions", "client_address", "cross_origin", "csrf_ok", "identify"]

COOKIE = "proctor_session"
SESSION_TTL_S = 12 * 3600.0


@dataclass(frozen=True)
class Identity:
    """An authenticated approver: name, client address, and how they proved it (`token|session|proxy`)."""

    name: str
    address: str
    via: str
    csrf: str = ""


@dataclass
class _Session:
    name: str
    csrf: str
    expires: float
    token_hash: str  # the stored hash of the token it was opened with


class Sessions:
    """Login sessions in memory: random ids, each with its own CSRF token."""

    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._by_id: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def open(self, name: str, token_hash: str) -> str:
        """A new session of `name`, opened with the token whose stored hash is `token_hash`."""
        sid = secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            self._by_id = {k: v for k, v in self._by_id.items() if v.expires > now}
            self._by_id[sid] = _Session(name, secrets.token_urlsafe(24), now + self.ttl_s, token_hash)
        return sid

    def get(self, sid: str) -> _Session | None:
        with self._lock:
            session = self._by_id.get(sid)
            if session is None or session.expires <= time.monotonic():
                self._by_id.pop(sid, None)
                return None
            return session

    def close(self, sid: str) -> None:
        with self._lock:
            self._by_id.pop(sid, None)


def client_address(request: Request, trusted_proxies: int) -> str:
    """The client's address: the peer's, or the N-th ``X-Forwarded-For`` entry from the right behind N proxies.

    With fewer entries than trusted proxies the request did not come through them all: the
    peer's own address is the only one known.
    """
    peer = request.client.host if request.client is not None else "unknown"
    if trusted_proxies <= 0:
        return peer
    entries = [e.strip() for h in request.headers.getlist("x-forwarded-for") for e in h.split(",")]
    entries = [e for e in entries if e]
    if len(entries) < trusted_proxies:
        return peer
    return entries[-trusted_proxies]


def identify(request: Request, tokens: TokenFile, sessions: Sessions, proxy_header: str | None,
             trusted_proxies: int = 0) -> Identity | None:
    """The approver making `request`, or None when it carries no valid credentials (headers only: no body is read)."""
    address = client_address(request, trusted_proxies)
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        name = tokens.who(auth[7:].strip())
        return Identity(name, address, "token") if name else None
    if proxy_header is not None:
        name = request.headers.get(proxy_header, "").strip()
        if name:
            return Identity(name, address, "proxy")
    sid = request.cookies.get(COOKIE)
    if sid:
        session = sessions.get(sid)
        if session is not None:
            if tokens.fingerprint(session.name) != session.token_hash:
                sessions.close(sid)  # its token was replaced or removed: it ends now, not in 12 hours
                return None
            return Identity(session.name, address, "session", session.csrf)
    return None


def csrf_ok(identity: Identity, sent: str | None) -> bool:
    """Whether an unsafe request of `identity` carries what it must: sessions need their CSRF token."""
    if identity.via != "session":
        return True
    return bool(sent) and hmac.compare_digest(identity.csrf, sent or "")


def cross_origin(request: Request) -> bool:
    """Whether an unsafe request says it came from another site (browsers send these headers)."""
    if request.headers.get("sec-fetch-site", "") == "cross-site":
        return True
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin == "null"
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    return origin.rstrip("/") != own
