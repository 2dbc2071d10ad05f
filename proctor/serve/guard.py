"""What every request to the inbox (and to `proctor mcp serve --http`) passes before any route sees it: body
limits, body types, headers.

A pure-ASGI middleware (no Starlette request object is built, nothing is parsed), so it
holds for every route alike, the unauthenticated ones (``/login``, ``/logout``) included:

- **Body size.** A declared ``Content-Length`` over the route's limit is answered 413 at
  once, before a byte of the body is read; a body without one (chunked) is counted as it
  streams in and cut off with 413 the moment it passes the limit. Nothing is buffered
  beyond the limit, so a held-open 48 MB body costs the server at most the limit.
- **Body type.** Only what a route takes is accepted: JSON (``application/json``) under
  ``/api/``, URL-encoded forms elsewhere. Multipart is refused everywhere (415): no route
  takes a file, and Starlette would spool a part of any size to disk before a route runs.
  (The MCP endpoint takes JSON alone: `json_bodies`.)
- **Headers on every response**, errors and static files included: a
  ``Content-Security-Policy`` that allows only this origin's own script and style and
  forbids framing (``frame-ancestors 'none'``, and ``X-Frame-Options: DENY`` for older
  browsers), ``nosniff``, no referrer to other sites, and no caching of pages that show approvals.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["CSP", "DEFAULT_MAX_BODY", "LOGIN_MAX_BODY", "SECURITY_HEADERS", "BodyTypeCheck", "RequestGuard",
           "inbox_bodies", "json_bodies"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
#: Why a body of a content type (its header's value) is refused on a path, or None when the path takes it.
BodyTypeCheck = Callable[[str, bytes], "str | None"]

#: The largest body an answer may have (edited arguments included), unless `--max-body` says otherwise.
DEFAULT_MAX_BODY = 1 << 20
#: ``/login`` and ``/logout`` carry a token and a CSRF value: a few hundred bytes.
LOGIN_MAX_BODY = 8 << 10

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # not no-referrer: browsers then send `Origin: null`
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)
_OWN = frozenset(name for name, _ in SECURITY_HEADERS)
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS"})


class RequestGuard:
    """Wraps the inbox's ASGI app: see the module docstring. `max_body` bounds every body but the login form's;
    `body_types` says which bodies each path takes (the inbox's routes by default)."""

    def __init__(self, app: ASGIApp, *, max_body: int = DEFAULT_MAX_BODY, body_types: BodyTypeCheck | None = None,
                 ) -> None:
        if max_body < LOGIN_MAX_BODY:
            raise ValueError(f"max_body must be at least {LOGIN_MAX_BODY} bytes")
        self.app = app
        self.max_body = max_body
        self.body_types: BodyTypeCheck = body_types or inbox_bodies

    def limit(self, path: str) -> int:
        return LOGIN_MAX_BODY if path in ("/login", "/logout") else self.max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_secured(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", ()) if k.lower() not in _OWN]
                message["headers"] = [*headers, *SECURITY_HEADERS]
            await send(message)

        path = str(scope.get("path", ""))
        method = str(scope.get("method", "GET")).upper()
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        limit = self.limit(path)
        declared = headers.get(b"content-length")
        chunked = b"chunked" in headers.get(b"transfer-encoding", b"").lower()
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await _refuse(send_secured, 400, "Content-Length is not a number")
                return
            if size < 0:
                await _refuse(send_secured, 400, "Content-Length is not a number")
                return
            if size > limit:
                await _refuse(send_secured, 413, f"request body of {size} bytes is over the {limit}-byte limit")
                return
        has_body = chunked or (declared is not None and declared != b"0")
        if has_body:
            if method in _BODYLESS:
                await _refuse(send_secured, 400, f"a {method} request takes no body")
                return
            refusal = self.body_types(path, headers.get(b"content-type", b""))
            if refusal is not None:
                await _refuse(send_secured, 415, refusal)
                return
        seen, refused = 0, False

        async def receive_bounded() -> Message:
            # Past the limit the 413 goes out at once and the app is told the client left: it
            # stops reading, and whatever it tries to answer is dropped (the 413 is the answer).
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    refused = True
                    if not started:
                        await _refuse(send_secured, 413, f"request body over the {limit}-byte limit")
                    return {"type": "http.disconnect"}
            return message

        async def send_unless_refused(message: Message) -> None:
            if not refused:
                await send_secured(message)

        try:
            await self.app(scope, receive_bounded, send_unless_refused)
        except Exception:
            if not refused:  # the app's own failure; a refused body's aftermath is not one
                raise


def inbox_bodies(path: str, content_type: bytes) -> str | None:
    """Why a body of `content_type` is refused on the inbox's `path`, or None when the route takes it."""
    kind = _kind(content_type)
    if path.startswith("/api/"):
        return None if kind == b"application/json" else "the API takes only application/json bodies"
    if kind == b"application/x-www-form-urlencoded":
        return None
    return "forms are taken only as application/x-www-form-urlencoded (no multipart: nothing here takes a file)"


def json_bodies(path: str, content_type: bytes) -> str | None:
    """JSON on every path (the MCP endpoint's JSON-RPC)."""
    return None if _kind(content_type) == b"application/json" else "only application/json bodies are taken"


def _kind(content_type: bytes) -> bytes:
    return content_type.split(b";", 1)[0].strip().lower()


async def _refuse(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
