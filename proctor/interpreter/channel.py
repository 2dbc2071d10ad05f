"""The wire between the host and the worker: length-prefixed JSON, nothing else.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON
(one object). Values that JSON cannot carry are tagged: ``{"$bytes": base64}``,
``{"$tuple": [...]}``, ``{"$set": [...]}``, ``{"$frozenset": [...]}`` and
``{"$dict": [[key, value], ...]}`` (dicts with non-string keys, or a user dict that
happens to look like a tag). Nothing is ever pickled: a frame decodes to plain
data or is rejected.

This module is imported by the worker too, so it uses the standard library only
and stays cheap to import.
"""

from __future__ import annotations

import base64
import json
import json.encoder
import os
import select
import struct
import time

TYPE_CHECKING = False  # typing is not imported at run time: the worker imports this module too
if TYPE_CHECKING:
    from typing import Any

#: How long the worker's reader polls before it blocks, when its host lets it (see `BlockingReader._spin`).
SPIN_NS = 200_000

__all__ = [
    "MAX_DEPTH",
    "MAX_MESSAGE",
    "EncodeError",
    "FrameReader",
    "BlockingReader",
    "ProtocolError",
    "SCALAR_TYPES",
    "call_frame",
    "count_values",
    "decode_value",
    "encode_value",
    "frame",
    "parse",
    "reply_frame",
    "write_all",
]

#: Largest frame either side accepts (bytes of JSON).
MAX_MESSAGE = 16 * 1024 * 1024
#: Deepest nesting of a value; deeper values are refused rather than recursed into. (The worker
#: sets these two to its interpreter's limits; the host passes its own limits explicitly.)
MAX_DEPTH = 100
#: Most arrays and objects, and most values in all, a frame the worker sends may hold.
MAX_CONTAINERS = 100_000
MAX_VALUES = 250_000
#: Largest call frame the worker sends: the host refuses one whose arguments are over the
#: tool's limit by their size, reading past its frame limit without keeping the bytes.
MAX_CALL = 2**32 - 1

_HEADER = struct.Struct(">I")


def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# json.dumps and json.loads build an encoder per call and wrap the C scanner in Python
# (whitespace regexes, argument checks); the channel calls the C parts directly, which
# halves both (1.2 vs 3.3 µs to encode a call, 0.9 vs 1.6 µs to decode one, on the
# development VM). ASCII-only output: a str holding lone surrogates still makes valid
# UTF-8 frames. No circular-reference markers: channel values are trees (encode_value
# builds them afresh, at most MAX_DEPTH deep), and a cycle would end in RecursionError.
_C_MAKE_ENCODER = getattr(json.encoder, "c_make_encoder", None)
_C_ENCODE = (_C_MAKE_ENCODER(None, _refuse, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
             if _C_MAKE_ENCODER is not None else None)
_PY_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # a Python built without the _json accelerator
#: The C scanner when there is one (always, in CPython); it returns (value, end) or raises StopIteration.
_SCAN = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009 - not in the typeshed stubs


def _dumps(message: Any) -> str:
    return "".join(_C_ENCODE(message, 0)) if _C_ENCODE is not None else _PY_ENCODE(message)


_TAGS = ("$bytes", "$tuple", "$set", "$frozenset", "$dict")
_SCALARS = (str, int, float, bool, type(None))
#: The exact types a value may have to cross the channel as itself, untagged.
SCALAR_TYPES = frozenset(_SCALARS)


class EncodeError(TypeError):
    """A value cannot be carried over the channel (names the offending type and where)."""


class ProtocolError(ValueError):
    """A frame or value broke the protocol: bad length, bad JSON, bad tag, too deep."""


def encode_value(value: Any, _where: str = "value") -> Any:
    """Turn `value` into JSON-safe data with tags; raise `EncodeError` naming the type and where it sits."""
    try:
        return _encode(value, 0)
    except _Unencodable as exc:
        where = _where + "".join(reversed(exc.path))
        raise EncodeError(exc.message.replace("{where}", where)) from None


class _Unencodable(Exception):
    def __init__(self, message: str) -> None:
        self.message = message
        self.path: list[str] = []


def _encode(value: Any, depth: int) -> Any:
    # The hot path (a call's arguments, a tool's result) is flat scalars: no per-item work for them.
    if type(value) in SCALAR_TYPES or isinstance(value, _SCALARS):
        return value
    if depth >= MAX_DEPTH:
        raise _Unencodable(f"{{where}} is nested more than {MAX_DEPTH} levels deep")
    d = depth + 1
    key: Any = None
    try:
        if isinstance(value, dict):
            # One pass for the usual dict (string keys, no "$" tag to escape); a non-string key or a
            # tag-like single key makes it a tagged list of pairs instead.
            out = {}
            for key, v in value.items():
                if type(key) is not str:
                    break
                out[key] = v if type(v) in SCALAR_TYPES else _encode(v, d)
            else:
                if len(out) != 1 or not key.startswith("$"):
                    return out
            pairs = []
            for key, v in value.items():
                pairs.append([_encode(key, d), _encode(v, d)])
            return {"$dict": pairs}
        if isinstance(value, (list, tuple)):
            items = []
            for key, v in enumerate(value):  # noqa: B007 - `key` names the place in an error
                items.append(v if type(v) in SCALAR_TYPES else _encode(v, d))
            return items if isinstance(value, list) else {"$tuple": items}
        if isinstance(value, (bytes, bytearray)):
            return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
        if isinstance(value, (set, frozenset)):
            key = "item"
            tag = "$frozenset" if isinstance(value, frozenset) else "$set"
            return {tag: [_encode(v, d) for v in value]}
    except _Unencodable as exc:
        exc.path.append(" item" if key == "item" and isinstance(value, (set, frozenset)) else f"[{key!r}]")
        raise
    raise _Unencodable(
        f"{{where}} of type {type(value).__name__} cannot be sent: use str, int, float, bool, None, "
        "bytes, list, tuple, set or dict values"
    )


def decode_value(data: Any, _depth: int = 0, _limit: int = 0) -> Any:
    """Undo `encode_value`; raise `ProtocolError` for an unknown tag, a malformed one, or a value
    nested deeper than `_limit` levels (default `MAX_DEPTH`)."""
    if isinstance(data, _SCALARS):
        return data
    limit = _limit or MAX_DEPTH
    if _depth >= limit:
        raise ProtocolError(f"value nested more than {limit} levels deep")
    d = _depth + 1
    if isinstance(data, list):
        return [v if type(v) in SCALAR_TYPES else decode_value(v, d, limit) for v in data]
    if not isinstance(data, dict):
        raise ProtocolError(f"unexpected JSON value of type {type(data).__name__}")
    if len(data) == 1:
        ((key, inner),) = data.items()
        if key.startswith("$"):
            return _decode_tag(key, inner, d, limit)
    return {k: v if type(v) in SCALAR_TYPES else decode_value(v, d, limit) for k, v in data.items()}


def _decode_tag(tag: str, inner: Any, depth: int, limit: int) -> Any:
    if tag not in _TAGS:
        raise ProtocolError(f"unknown value tag {tag!r}")
    if tag == "$bytes":
        if not isinstance(inner, str):
            raise ProtocolError("$bytes must hold a base64 string")
        try:
            return base64.b64decode(inner.encode("ascii"), validate=True)
        except ValueError as exc:
            raise ProtocolError(f"$bytes is not valid base64: {exc}") from None
    if not isinstance(inner, list):
        raise ProtocolError(f"{tag} must hold a list")
    items = [decode_value(v, depth, limit) for v in inner]
    try:
        if tag == "$tuple":
            return tuple(items)
        if tag == "$set":
            return set(items)
        if tag == "$frozenset":
            return frozenset(items)
        pairs: dict[Any, Any] = {}
        for pair in items:
            if not isinstance(pair, list) or len(pair) != 2:
                raise ProtocolError("$dict must hold [key, value] pairs")
            pairs[pair[0]] = pair[1]
        return pairs
    except TypeError as exc:  # an unhashable set member or dict key
        raise ProtocolError(f"{tag}: {exc}") from None


def frame(message: dict[str, Any]) -> bytes:
    """One frame holding `message` (already made of JSON-safe data)."""
    try:
        return _framed(_dumps(message))
    except (ValueError, TypeError, RecursionError) as exc:  # e.g. an int past the 4300-digit limit
        raise EncodeError(f"message cannot be encoded: {str(exc)[:200]}") from None


# The two frames of every tool call, spelled out: the encoder's set-up costs more than the
# message (15k instructions for a reply holding "a", 4k this way). Same bytes as `frame`
# of the same dict, key order included (tested).
def call_frame(rid: int, run: int, tool: str, args: dict[str, Any]) -> bytes:
    """`frame({"t": "call", "id": rid, "run": run, "tool": tool, "args": args})`, sooner (`_json` and
    `_framed` inline: the worker's every call)."""
    try:
        body = (f'{{"t":"call","id":{int(rid)},"run":{int(run)},"tool":{_ESCAPE(tool)},'
                f'"args":{_dumps(args) if type(args) is dict else _json(args)}}}').encode("ascii")
    except (ValueError, TypeError, RecursionError) as exc:
        raise EncodeError(f"message cannot be encoded: {str(exc)[:200]}") from None
    if len(body) > MAX_CALL:
        raise EncodeError(f"message of {len(body)} bytes is larger than the {MAX_CALL}-byte limit")
    return _HEADER.pack(len(body)) + body


def reply_frame(rid: int, value: Any, spin: bool = True) -> bytes:
    """`frame({"t": "reply", "id": rid, "ok": True, "value": value})`, sooner; with ``"spin": false``
    added when the worker should block at once while it waits for its next message (see
    `proctor.interpreter.spinning`)."""
    try:  # `_json` of a str and `_framed`, inline: the host's every answer
        body = (f'{{"t":"reply","id":{int(rid)},"ok":true,'
                f'"value":{_ESCAPE(value) if type(value) is str else _json(value)}{_END[spin]}').encode("ascii")
    except (ValueError, TypeError, RecursionError) as exc:
        raise EncodeError(f"message cannot be encoded: {str(exc)[:200]}") from None
    if len(body) > MAX_MESSAGE:
        raise EncodeError(f"message of {len(body)} bytes is larger than the {MAX_MESSAGE}-byte limit")
    return _HEADER.pack(len(body)) + body


_END = (',"spin":false}', "}")  # a reply's last bytes, by whether the worker may spin
_ESCAPE = json.encoder.encode_basestring_ascii
_LITERALS = {None: "null", True: "true", False: "false"}


def _json(value: Any) -> str:
    t = type(value)
    if t is str:
        return _ESCAPE(value)
    if t is int:
        return int.__repr__(value)  # past 4300 digits a ValueError, as from the encoder
    if t is bool or value is None:
        return _LITERALS[value]
    return _dumps(value)


def _framed(text: str, limit: int = 0) -> bytes:
    body = text.encode("ascii")
    limit = limit or MAX_MESSAGE
    if len(body) > limit:
        raise EncodeError(f"message of {len(body)} bytes is larger than the {limit}-byte limit")
    return _HEADER.pack(len(body)) + body


_STRINGS: Any = None


def count_values(body: bytes, max_containers: int, max_values: int) -> tuple[int, int]:
    """(containers, values) of the JSON in `body`: arrays and objects, and all values (containers
    and the items in them) — upper bounds, exact enough to hold against the two limits.

    Counting brackets and commas is a C loop over the bytes; those inside strings only make the
    counts high, so counts over a limit are redone without the strings (possessive regex: linear).
    """
    containers = body.count(b"[") + body.count(b"{")
    values = containers + body.count(b",") + 1  # every value but the outermost follows a comma or opens a container
    if containers <= max_containers and values <= max_values:
        return containers, values
    global _STRINGS
    if _STRINGS is None:
        import re  # rarely needed: the worker does not pay for it at start-up

        _STRINGS = re.compile(rb'"(?:[^"\\]++|\\.)*+"')
    bare: bytes = _STRINGS.sub(b"", body)
    containers = bare.count(b"[") + bare.count(b"{")
    return containers, containers + bare.count(b",") + 1


def parse(body: bytes) -> dict[str, Any]:
    """Decode one frame body into a JSON object; raise `ProtocolError` otherwise."""
    try:
        text = body.decode("utf-8")
        message, end = _SCAN(text, 0)
    except StopIteration as stop:  # the scanner's "no JSON value starts here"
        raise ProtocolError(f"frame is not valid JSON: expecting a value at char {stop.value}") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ProtocolError(f"frame is not valid JSON: {str(exc)[:200]}") from None
    if end != len(text):
        raise ProtocolError(f"frame is not valid JSON: extra data at char {end}")
    if type(message) is not dict:
        raise ProtocolError(f"frame holds a JSON {type(message).__name__}, not an object")
    return message


class FrameReader:
    """Incremental, non-blocking frame splitter for the host: feed bytes, get messages."""

    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._buf = bytearray()
        self._max = max_message

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Add received bytes; return every complete message, or raise `ProtocolError`."""
        if not self._buf and len(data) >= 4:  # fast path: exactly one whole frame, no copying
            (size,) = _HEADER.unpack_from(data)
            if size <= self._max and len(data) == 4 + size:
                return [parse(data[4:])]
        self._buf += data
        out: list[dict[str, Any]] = []
        while len(self._buf) >= 4:
            (size,) = _HEADER.unpack_from(self._buf)
            if size > self._max:
                raise ProtocolError(f"frame announces {size} bytes, more than the {self._max}-byte limit")
            if len(self._buf) < 4 + size:
                break
            body = bytes(self._buf[4 : 4 + size])
            del self._buf[: 4 + size]
            out.append(parse(body))
        return out

    @property
    def pending(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        return len(self._buf)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """Write `data` to a blocking fd: one write when it fits the socket buffer, as it drains if not.

    (`proctor.audit.storage.write_all` does the same for log files; this module cannot
    import it: it is all the worker gets, standard library only.)
    """
    n = os.write(fd, data)
    if n < len(data):  # a frame larger than the socket buffer: write the rest as it drains
        view = memoryview(data)[n:]
        while view:
            view = view[os.write(fd, view):]


class BlockingReader:
    """Frames from a blocking fd, one ``read`` per frame in the common case (the worker's side).

    It polls for up to `SPIN_NS` before it blocks unless the last message it read said
    ``"spin": false``: the host says so unless its run is alone (`proctor.interpreter.spinning`),
    when polling would take a core from an end that has work.
    """

    def __init__(self, fd: int, max_message: int = MAX_MESSAGE) -> None:
        self.fd = fd
        self.spin = True
        self._splitter = FrameReader(max_message)
        self._ready: list[dict[str, Any]] = []
        self._poll = select.poll()  # registered once: half the cost of a select() per look
        self._poll.register(fd, select.POLLIN)

    def _spin(self) -> bool:
        """Poll briefly before blocking: a reply usually comes within tens of µs, and a vCPU
        that goes idle in a blocking read wakes up slowly (measured: 2x the round trip).
        True once a message is there."""
        poll = self._poll.poll
        deadline = time.perf_counter_ns() + SPIN_NS
        while not poll(0):
            if time.perf_counter_ns() > deadline:
                return False
        return True

    def recv(self) -> dict[str, Any] | None:
        """The next message; None once the other side closed the channel."""
        if self._ready:
            message = self._ready.pop(0)
            self.spin = message.get("spin") is not False
            return message
        while True:
            # It blocks in read itself (one system call, not a poll and then a read): the channel is a
            # pipe of its own, whose readers only its writer wakes. (A reader asleep in read() on a Unix
            # socket, the channel before, was also woken each time the host *took* a frame from its side
            # of the same socket: the "room to write" wake-up shared the socket's one wait queue.)
            if self.spin and not self._poll.poll(0):
                self._spin()
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                if self._splitter.pending:
                    raise ProtocolError("channel closed in the middle of a frame")
                return None
            messages = self._splitter.feed(chunk)
            if messages:
                self._ready += messages[1:]
                message = messages[0]
                self.spin = message.get("spin") is not False
                return message
