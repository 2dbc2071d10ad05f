"""What bounds a streamable HTTP server's answers: each response body read at most `limit` bytes at a time.

The SDK reads a JSON answer whole (`response.aread()`), however long, and 1.x reads an SSE event
whole too. `bound_responses` puts a response hook on the SDK's own HTTP client that wraps each
body as it arrives: a JSON body, or one SSE event (bytes since the last blank line), past `limit`
calls `cut` with why and stops the read. What the SDK then does with the failed read differs by
version (an error answer, a log line, nothing), so `Cuttable` is the read stream the session
reads instead of the SDK's: `cut` ends it, and the session ends its requests in flight as for a
connection that closed, whatever the SDK made of the failed read.

The bound counts bytes as they arrive, before the HTTP client decompresses them, so a compressed body
would escape it (a few hundred kilobytes of gzip make gigabytes): the client asks for bodies as they are
(``Accept-Encoding: identity``), and a body the server compresses all the same is cut before it is read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from importlib.metadata import version
from typing import Any

import anyio

from proctor.termsafe import terminal_safe

__all__ = ["Cuttable", "bound_responses"]


def _httpx() -> Any:
    """The HTTP package this SDK major's client is made with (2.x: httpx2, 1.x: httpx; both may be installed)."""
    if int(version("mcp").split(".")[0]) >= 2:
        import httpx2

        return httpx2
    import httpx

    return httpx


_HTTPX = _httpx()


class _BoundedBody(_HTTPX.AsyncByteStream):  # type: ignore[misc,name-defined,unused-ignore]
    def __init__(self, inner: Any, limit: int, events: bool, cut: Callable[[str], None]) -> None:
        self._inner, self._limit, self._events, self._cut = inner, limit, events, cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        held = 0  # bytes of the body (JSON), or of the SSE event not yet ended
        last = b""  # the previous chunk's last byte: an event's two line ends may come in two reads
        async for chunk in self._inner:
            if self._events and (end := _event_end(last + chunk)) != -1:
                held = len(last) + len(chunk) - end
            else:
                held += len(chunk)
            last = chunk[-1:]
            if held > self._limit:
                what = "an event" if self._events else "an answer"
                why = (f"the server sent {what} of more than {self._limit} bytes (max_message_bytes={self._limit}); "
                       "proctor closed the session")
                self._cut(why)
                raise _HTTPX.ReadError(why)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


def _event_end(data: bytes) -> int:
    """Where the last SSE event in `data` ends (-1: none does): at an empty line, that is two line ends in a row,
    each CRLF, LF or CR (an LF then a CR, or two of either, is always such a pair)."""
    return max(data.rfind(b"\n\n"), data.rfind(b"\r\r"), data.rfind(b"\n\r"))


class _Compressed(_HTTPX.AsyncByteStream):  # type: ignore[misc,name-defined,unused-ignore]
    """A body the server compressed, unasked: refused at its first byte (its size once decompressed is unknown)."""

    def __init__(self, inner: Any, encoding: str, cut: Callable[[str], None]) -> None:
        self._inner, self._encoding, self._cut = inner, encoding, cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            if chunk:
                why = (f"the server sent a compressed answer (Content-Encoding: {terminal_safe(self._encoding[:80])}) "
                       "though proctor asked for none (Accept-Encoding: identity): its size is not known until it is "
                       "decompressed, so max_message_bytes cannot bound it; proctor closed the session")
                self._cut(why)
                raise _HTTPX.ReadError(why)
        return
        yield  # (an async generator that yields nothing)

    async def aclose(self) -> None:
        await self._inner.aclose()


def bound_responses(client: Any, *, limit: int, cut: Callable[[str], None]) -> None:
    """Bound every response body `client` (the SDK's ``create_mcp_http_client()``) reads by `limit` (see the module)."""

    async def hook(response: Any) -> None:
        encoding = response.headers.get("content-encoding", "").strip()
        if encoding.lower() not in ("", "identity"):
            response.stream = _Compressed(response.stream, encoding, cut)
            return
        events = response.headers.get("content-type", "").startswith("text/event-stream")
        response.stream = _BoundedBody(response.stream, limit, events, cut)

    client.headers["Accept-Encoding"] = "identity"  # what the bound counts is what the SDK keeps (see the module)
    hooks = client.event_hooks
    client.event_hooks = {**hooks, "response": [*hooks.get("response", []), hook]}


class Cuttable:
    """The read stream a session reads: the SDK's, relayed (`pump`) until the transport is `cut`."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._send, self._receive = anyio.create_memory_object_stream[Any](0)

    async def pump(self) -> None:
        """Relay the SDK's messages until it ends, or `cut` closes the relay (run in a task of its own)."""
        try:
            async with self._send:
                async for item in self._inner:
                    await self._send.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            pass

    def cut(self) -> None:
        """End the stream now: the session sees its connection close."""
        self._send.close()

    @property
    def last_context(self) -> Any:
        """(2.x) The trace context of the message last relayed, as the SDK's stream gives it."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        return await self._receive.receive()

    def __aiter__(self) -> Cuttable:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def aclose(self) -> None:  # the SDK's stream too: its transport leaves closing it to the session
        await self._receive.aclose()
        await self._inner.aclose()

    def close(self) -> None:
        self._receive.close()
        self._inner.close()

    async def __aenter__(self) -> Cuttable:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
