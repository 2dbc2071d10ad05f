"""The stdio transport `MCPToolset` speaks to a server started as a subprocess: the SDK's, with each line bounded.

The SDK's ``stdio_client`` keeps what the server writes until a newline comes, however much that is,
and joins each new chunk to all of it: a server that writes one line without end (or a 40 MB answer)
costs proctor memory without bound and, before any limit of proctor's could look at it, CPU that grows
with the square of the line (seconds for 40 MB, with the GIL held, so every session of the process
stalls). This transport is the SDK's, message for message — the same process start (its own session,
so that the whole tree can be stopped), environment, parsing into the SDK's ``SessionMessage`` and
shutdown (stdin closed, a grace period, then the process group terminated) — except that it splits
bytes as they come, keeps at most `max_line` bytes of a line not yet ended, and ends the session when
a line would be longer: the process group is killed at once (a server writing without end is not
waited for), the session sees its connection close, and `ended` says why, for the toolset's error.

The server's stdout is a pipe of proctor's own (`_ReadPipe`), not one of the subprocess's: a process the
server started in a session of its own (out of reach of the stop) may keep it open, and proctor's end is
closed all the same when the session ends (a subprocess's pipe stays open with its transport until the
collector finds the toolset's loop closed).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, TextIO

import anyio
import anyio.abc
from mcp import StdioServerParameters
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from proctor.telemetry.logging import get_logger
from proctor.termsafe import terminal_safe

__all__ = ["BoundedStdio"]

log = get_logger("proctor.mcp")

#: The SDK's waits: for the server to exit once its stdin is closed, for SIGTERM before SIGKILL, for the writer.
_EXIT_GRACE_S = 2.0
_KILL_GRACE_S = 2.0
_WRITER_FLUSH_S = 0.5


def _codec() -> tuple[Callable[[str], Any], Callable[[Any], str]]:
    """How this SDK major parses a line into a JSON-RPC message and writes one (as its own stdio transport does)."""
    try:  # 2.x
        from mcp.types import jsonrpc_message_adapter  # type: ignore[attr-defined,unused-ignore]
    except ImportError:  # 1.x
        from mcp.types import JSONRPCMessage

        return (JSONRPCMessage.model_validate_json,  # type: ignore[attr-defined,unused-ignore]
                lambda message: message.model_dump_json(by_alias=True, exclude_none=True))

    def parse(line: str) -> Any:
        return jsonrpc_message_adapter.validate_json(line, by_name=False)

    return parse, lambda message: message.model_dump_json(by_alias=True, exclude_unset=True)


_PARSE, _DUMP = _codec()


class _Overlong(Exception):
    pass


class _ReadPipe:
    """The read end of the server's stdout, on the running loop: `receive` as anyio's stream does, `close` ours."""

    _CHUNK = 65536

    def __init__(self, reader: asyncio.StreamReader, transport: asyncio.ReadTransport) -> None:
        self._reader, self._transport = reader, transport

    @classmethod
    async def open(cls, fd: int) -> _ReadPipe:
        """Read `fd` on the running loop (it is ours from now on: closed if this fails)."""
        try:
            pipe = os.fdopen(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise
        reader = asyncio.StreamReader(limit=cls._CHUNK)
        try:
            transport, _ = await asyncio.get_running_loop().connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), pipe)
        except BaseException:
            pipe.close()
            raise
        return cls(reader, transport)

    async def receive(self) -> bytes:
        """The next bytes the server wrote; `anyio.EndOfStream` once it (and every process holding it) closed it."""
        chunk = await self._reader.read(self._CHUNK)
        if not chunk:
            raise anyio.EndOfStream
        return chunk

    def close(self) -> None:
        """Close our end (a read waiting on it ends): what the server still writes fails on a broken pipe."""
        self._transport.close()


class BoundedStdio:
    """One session's transport (`connect`); `ended` says why it closed the session itself, if it did."""

    def __init__(self, server: StdioServerParameters, *, max_line: int, errlog: TextIO) -> None:
        self.server, self.max_line, self.errlog = server, max_line, errlog
        self.ended: str | None = None
        #: Lines that were no JSON-RPC message: the first is logged, the rest counted (logged when the session ends).
        self.unreadable = 0

    def _unreadable(self, exc: Exception) -> None:
        self.unreadable += 1
        if self.unreadable == 1:  # a line costs the server two bytes; a log line each would let it fill the log
            log.warning("mcp_unreadable_line", error=terminal_safe(str(exc)[:300]),
                        note="later ones are counted, and the count logged when the session ends")

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[tuple[Any, Any]]:
        """The streams a ``ClientSession`` reads and writes, while the server runs."""
        server = self.server
        ours, theirs = os.pipe()
        try:
            process = await anyio.open_process([server.command, *server.args],
                                               env=get_default_environment() | (server.env or {}), stdout=theirs,
                                               stderr=self.errlog, cwd=server.cwd, start_new_session=True)
        except BaseException:
            os.close(ours)
            raise
        finally:
            os.close(theirs)
        try:
            stdout = await _ReadPipe.open(ours)
        except BaseException:
            _kill_group(process)
            raise
        to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
        writer_done = anyio.Event()

        async def reader() -> None:
            try:
                async with to_session:
                    try:
                        await self._read(stdout, to_session)
                    except _Overlong:  # said before the session sees its connection close
                        self.ended = (f"the server wrote a line of more than {self.max_line} bytes "
                                      f"(max_message_bytes={self.max_line}); proctor closed the session and stopped "
                                      "the server")
                        log.warning("mcp_line_too_long", command=terminal_safe(server.command),
                                    max_message_bytes=self.max_line)
                        _kill_group(process)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                pass  # the session is gone; shutdown stops the server
            finally:
                await _discard(stdout)
                if self.unreadable > 1:
                    log.warning("mcp_unreadable_lines", count=self.unreadable)

        async def writer() -> None:
            stdin = process.stdin
            assert stdin is not None
            try:
                async with from_session:
                    async for item in from_session:
                        await stdin.send((_DUMP(item.message) + "\n").encode(server.encoding,
                                                                               server.encoding_error_handler))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await to_session.aclose()  # the server no longer reads: the session sees the connection end
            finally:
                writer_done.set()

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(reader)
            tasks.start_soon(writer)
            try:
                yield read_stream, write_stream
            finally:
                with anyio.CancelScope(shield=True):  # the server is stopped even when the caller is cancelled
                    read_stream.close()
                    write_stream.close()
                    with anyio.move_on_after(_WRITER_FLUSH_S):
                        await writer_done.wait()
                    await _stop(process)
                    stdout.close()  # (a process the server started may hold it still)
                    for stream in (read_stream, write_stream, to_session, from_session):
                        await stream.aclose()
                tasks.cancel_scope.cancel()

    async def _read(self, stdout: _ReadPipe, to_session: Any) -> None:
        """Send the session each line the server writes, parsed; raise `_Overlong` at a line past `max_line`."""
        limit, encoding, errors = self.max_line, self.server.encoding, self.server.encoding_error_handler
        pending = bytearray()  # the start of a line not yet ended
        while True:
            try:
                chunk = await stdout.receive()
            except anyio.EndOfStream:
                return
            start = 0
            while (end := chunk.find(b"\n", start)) != -1:
                if len(pending) + end - start > limit:
                    raise _Overlong
                if pending:
                    pending += chunk[start:end]
                    line, pending = bytes(pending), bytearray()
                else:
                    line = chunk[start:end]
                start = end + 1
                if not line or line.isspace():  # between messages, nothing to parse (nor to log, once a byte)
                    continue
                message = _message(line, encoding, errors)
                if isinstance(message, Exception):
                    self._unreadable(message)
                await to_session.send(message)
            if len(pending) + len(chunk) - start > limit:
                raise _Overlong
            pending += memoryview(chunk)[start:]


def _message(line: bytes, encoding: str, errors: str) -> SessionMessage | Exception:
    """One line as the SDK hands it to the session: a message, or the exception parsing it raised."""
    try:
        return SessionMessage(_PARSE(line.decode(encoding, errors)))
    except ValueError as exc:  # (UnicodeDecodeError and pydantic's ValidationError are ValueErrors)
        return exc


async def _discard(stdout: _ReadPipe) -> None:
    """Read and drop what the server still writes, so that one blocked on a full pipe can exit (shielded: it ends
    when the pipe does, which stopping the server, or closing our end, brings about)."""
    with anyio.CancelScope(shield=True), suppress(anyio.EndOfStream, anyio.ClosedResourceError,
                                                   anyio.BrokenResourceError, OSError):
        while True:
            await stdout.receive()


def _kill_group(process: anyio.abc.Process) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def _stop(process: anyio.abc.Process) -> None:
    """The SDK's shutdown: stdin closed, `_EXIT_GRACE_S` to exit, then the process group terminated."""
    for pipe in (process.stdin,):
        if pipe is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await pipe.aclose()
    if not await _exited(process, _EXIT_GRACE_S):
        with suppress(ProcessLookupError, OSError):
            await terminate_posix_process_tree(process, _KILL_GRACE_S)
        await _exited(process, _KILL_GRACE_S)


async def _exited(process: anyio.abc.Process, within: float) -> bool:
    """Whether the process exited within `within` seconds (its return code polled: a child that inherited the
    pipes would make waiting for them look like a hung server)."""
    with anyio.move_on_after(within):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None
