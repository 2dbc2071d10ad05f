"""Who is asking: bearer tokens, login sessions, a trusted proxy header; and CSRF for forms.

- ``Authorization: Bearer TOKEN`` (the API, `proctor approvals --server`): checked against
  the token file's hashes on every request. Not ambient, so it needs no CSRF token.
- A session: the login form takes a token and sets ``proctor_session`` (HttpOnly,
  SameSite=Strict, Secure over https). Sessions live in the server's memory (a restart
  logs everyone out) and expire after `SESSION_TTL_S`. Every unsafe request made with a
  session must carry the session's CSRF token (form field ``csrf`` or header
  ``X-CSRF-Token``).
- A reverse proxy's user header (``--trust-proxy-header X-Forwarded-User``), only when
  enabled: the proxy authenticates, and then also gives the client's address
  (``X-Forwarded-For``).

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

from proctor.serve.tokens import TokenFile

__all__ = ["COOKIE", "SESSION_TTL_S", "Identity", "Sessions", "cross_origin", "csrf_ok", "identify"]

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


class Sessions:
    """Login sessions in memory: random ids, each with its own CSRF token."""

    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._by_id: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def open(self, name: str) -> str:
        sid = secrets.token_urlsafe(32)
        with self._lock:
            now = time.monotonic()
            self._by_id = {k: v for k, v in self._by_id.items() if v.expires > now}
            self._by_id[sid] = _Session(name, secrets.token_urlsafe(24), now + self.ttl_s)
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


def _address(request: Request, proxied: bool) -> str:
    if proxied:
        forwarded = request.headers.get("x-forwarded-for", "").split(",")[0].strip()
        if forwarded:
            return forwarded
    return request.client.host if request.client is not None else "unknown"


def identify(request: Request, tokens: TokenFile, sessions: Sessions, proxy_header: str | None) -> Identity | None:
    """The approver making `request`, or None when it carries no valid credentials."""
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        name = tokens.who(auth[7:].strip())
        return Identity(name, _address(request, proxy_header is not None), "token") if name else None
    if proxy_header is not None:
        name = request.headers.get(proxy_header, "").strip()
        if name:
            return Identity(name, _address(request, True), "proxy")
    sid = request.cookies.get(COOKIE)
    if sid:
        session = sessions.get(sid)
        if session is not None:
            return Identity(session.name, _address(request, proxy_header is not None), "session", session.csrf)
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
