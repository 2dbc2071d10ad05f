"""The host's bounds on what a worker sends, applied to the raw bytes before anything is decoded.

A frame is refused or screened by its size first: a frame no larger than a few KiB is
decoded as is (it cannot hold more than the limits allow); a larger one is checked for
its container count (brackets outside strings) and, when it is a call, for the size of
its arguments against the tool's limit; a frame over `max_frame_bytes` is never kept in
memory: a call is streamed through a hash and refused, anything else kills the worker.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from proctor.interpreter.channel import MAX_DEPTH, ProtocolError, count_values, parse

__all__ = ["MiB", "ChannelLimits", "HostFrameReader", "OversizedCall", "call_args_bytes", "size_text"]

KiB = 1024
MiB = 1024 * KiB
_HEADER = struct.Struct(">I")
#: The call frame's layout as the worker writes it (`channel.call_frame`), up to its arguments.
_CALL = re.compile(rb'\{"t":"call","id":([0-9]{1,19}),"run":([0-9]{1,19}),"tool":"([A-Za-z_][A-Za-z0-9_]{0,199})",'
                   rb'("at":"[0-9:]{1,39}",)?"args":')
#: Enough of a frame's start to match `_CALL`.
_HEAD = 300


def size_text(n: int) -> str:
    """``1,048,576 bytes (1 MiB)``: exact, and readable."""
    for unit, scale in (("GiB", 1024 * MiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            amount = n / scale
            return f"{n:,} bytes ({amount:.1f} {unit})" if amount % 1 else f"{n:,} bytes ({int(amount)} {unit})"
    return f"{n:,} bytes"


def call_args_bytes(frame_size: int, rid: int, run: int, tool: str, at_bytes: int = 0) -> int:
    """Bytes of a call's arguments, from its frame's size (the rest of the frame is its envelope, with
    the call's position, `at_bytes` long, when the frame has one: `CallRequest.at_bytes`)."""
    return frame_size - 43 - len(str(rid)) - len(str(run)) - len(tool) - at_bytes


@dataclass(frozen=True)
class ChannelLimits:
    """Every bound the host applies to one worker's messages (see docs/sandbox.md, "Limits")."""

    max_frame_bytes: int = 4 * MiB
    max_depth: int = MAX_DEPTH
    max_containers: int = 100_000
    max_values: int = 250_000
    max_arg_bytes: int = 1 * MiB
    max_run_arg_bytes: int = 64 * MiB
    tool_arg_bytes: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("max_frame_bytes", "max_depth", "max_containers", "max_values", "max_arg_bytes",
                     "max_run_arg_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.max_depth > MAX_DEPTH:
            raise ValueError(f"max_depth must be at most {MAX_DEPTH}, got {self.max_depth}")

    def arg_limit(self, tool: str) -> tuple[int, str]:
        """The per-call argument limit for `tool`, and where it was set."""
        limit = self.tool_arg_bytes.get(tool)
        if limit is not None:
            return limit, f"the policy's tools.{tool}.max_arg_bytes"
        return self.max_arg_bytes, "max_arg_bytes"

    @property
    def small_frame(self) -> int:
        """Frames up to this size are decoded without screening: they cannot break any limit."""
        smallest = min([self.max_arg_bytes, *self.tool_arg_bytes.values()])
        # A frame of n bytes holds at most n containers and 2n + 1 values.
        return max(0, min(4 * KiB, smallest, self.max_containers, (self.max_values - 1) // 2, self.max_frame_bytes))


class OversizedCall(NamedTuple):
    """A call refused by its size before decoding: what the host knows of it."""

    id: int
    run: int
    tool: str
    size: int  # bytes of its arguments
    limit: int
    setting: str  # which limit
    sha256: str  # of the arguments' bytes as sent
    what: str = "arguments"


class _Stream:
    """A call frame over the frame limit, being hashed as it arrives (never kept)."""

    __slots__ = ("call", "hasher", "last", "left")

    def __init__(self, call: OversizedCall, left: int, first: bytes) -> None:
        self.call, self.left, self.hasher = call, left, hashlib.sha256()
        self.last = b""
        self.take(first)

    def take(self, data: bytes | memoryview) -> None:
        # One byte behind: the frame's last byte closes the call object; it is not part of the arguments.
        if not data:
            return
        self.hasher.update(self.last)
        self.hasher.update(data[:-1])
        self.last = bytes(data[-1:])
        self.left -= len(data)


class HostFrameReader:
    """Incremental frame splitter for the host: feed bytes, get ``(frame size, message)`` pairs.

    A message is the decoded JSON object, or an `OversizedCall` for a call refused by its
    size before its arguments were decoded. Raises `ProtocolError` for a frame that breaks
    the protocol (bad JSON, too many containers, too large and not a call).
    """

    def __init__(self, limits: ChannelLimits) -> None:
        self.limits = limits
        self._buf = bytearray()
        self._max = limits.max_frame_bytes
        self._small = limits.small_frame
        self._stream: _Stream | None = None
        self._stream_size = 0

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        """Add received bytes; return every complete message."""
        if self._stream is None and not self._buf and len(data) >= 4:  # fast path: one whole small frame
            (size,) = _HEADER.unpack_from(data)
            if size <= self._small and len(data) == 4 + size:
                return [(size, parse(data[4:]))]
        out: list[tuple[int, Any]] = []
        if self._stream is not None:
            data = self._streamed(data, out)
        self._buf += data
        while self._stream is None and len(self._buf) >= 4:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > self._max:
                if len(self._buf) < 4 + min(size, _HEAD):
                    break
                rest = bytes(self._buf[4:])
                self._buf.clear()
                self._start_stream(size, rest, out)
                continue
            if len(self._buf) < 4 + size:
                break
            body = bytes(self._buf[4 : 4 + size])
            del self._buf[: 4 + size]
            out.append((size, self._decode(body)))
        return out

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf) + (self._stream.left if self._stream is not None else 0)

    def _start_stream(self, size: int, rest: bytes, out: list[tuple[int, Any]]) -> None:
        m = _CALL.match(rest)
        if m is None:
            raise ProtocolError(f"frame of {size:,} bytes is over the {self._max:,}-byte limit and is not a call")
        tool = m.group(3).decode("ascii")
        limit, setting = self.limits.arg_limit(tool)
        call = OversizedCall(int(m.group(1)), int(m.group(2)), tool, size - m.end() - 1, limit, setting, "")
        self._stream = _Stream(call, size - m.end(), b"")
        self._stream_size = size
        leftover = self._streamed(rest[m.end():], out)
        self._buf += leftover

    def _streamed(self, data: bytes, out: list[tuple[int, Any]]) -> bytes:
        stream = self._stream
        assert stream is not None
        view = memoryview(data)
        n = min(stream.left, len(view))
        stream.take(view[:n])
        if stream.left == 0:
            if stream.last != b"}":
                raise ProtocolError("a call frame that does not end its object")
            out.append((self._stream_size, stream.call._replace(sha256=stream.hasher.hexdigest())))
            self._stream = None
        return bytes(view[n:])

    def _decode(self, body: bytes) -> Any:
        if len(body) <= self._small:
            return parse(body)
        limits = self.limits
        m = _CALL.match(body)
        if m is not None and body.endswith(b"}"):
            tool = m.group(3).decode("ascii")
            size = len(body) - m.end() - 1
            limit, setting = limits.arg_limit(tool)
            if size > limit:
                return OversizedCall(int(m.group(1)), int(m.group(2)), tool, size, limit, setting,
                                     hashlib.sha256(memoryview(body)[m.end():-1]).hexdigest())
            containers, values = count_values(body, limits.max_containers + 1, limits.max_values + 5)
            # the call's own object and its four fields (five with its position)
            containers, values = containers - 1, values - (6 if m.group(4) else 5)
            over = None
            if containers > limits.max_containers:
                over = (containers, limits.max_containers, "max_containers", "lists, dicts, tuples and sets")
            elif values > limits.max_values:
                over = (values, limits.max_values, "max_values", "values")
            if over is not None:
                return OversizedCall(int(m.group(1)), int(m.group(2)), tool, over[0], over[1], over[2],
                                     hashlib.sha256(memoryview(body)[m.end():-1]).hexdigest(), over[3])
            return parse(body)
        containers, values = count_values(body, limits.max_containers, limits.max_values)
        if containers > limits.max_containers or values > limits.max_values:
            raise ProtocolError(f"frame holds {containers:,} containers and {values:,} values, more than the limits "
                                f"({limits.max_containers:,} and {limits.max_values:,})")
        message = parse(body)
        if message.get("t") == "call":
            raise ProtocolError(f"a call frame of {len(body):,} bytes not in the channel's layout")
        return message
