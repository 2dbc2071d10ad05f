"""Tests for the channel: tagged values, framing limits, and what the host accepts from a worker."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest

from proctor.errors import BudgetExceeded, ToolFailed
from proctor.interpreter.channel import (
    MAX_MESSAGE,
    EncodeError,
    FrameReader,
    ProtocolError,
    call_frame,
    decode_value,
    encode_value,
    frame,
    reply_frame,
)
from proctor.interpreter.messages import CallRequest, Done, error_payload, parse_worker_message


@pytest.mark.parametrize("value", [
    None, True, 1, -2**70, 1.5, "text", [1, [2]], {"a": {"b": None}}, b"\x00\x01", bytearray(b"ab"),
    (1, (2, 3)), {1, 2}, frozenset({"x"}), {1: "int key", (1, 2): "tuple key"}, {"$tuple": [1]},
    {"$bytes": "AA==", "other": 1}, [{"$set": []}],
])
def test_values_round_trip(value: Any) -> None:
    """Every supported value decodes to an equal value of the same type, including tag-like dicts."""
    data = json.loads(json.dumps(encode_value(value)))
    back = decode_value(data)
    assert back == (bytes(value) if isinstance(value, bytearray) else value)
    assert type(back) is (bytes if isinstance(value, bytearray) else type(value))


def test_unencodable_value_names_its_type_and_place() -> None:
    """An object that is not data is refused with its type and where it sits."""
    with pytest.raises(EncodeError, match=r"value\['k'\]\[1\] of type object"):
        encode_value({"k": [1, object()]})


def test_too_deep_values_are_refused_both_ways() -> None:
    """Deep nesting is refused rather than recursed into."""
    deep: Any = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(EncodeError):
        encode_value(deep)
    with pytest.raises(ProtocolError):
        decode_value(json.loads("[" * 200 + "]" * 200))


@pytest.mark.parametrize("data", [{"$nope": 1}, {"$bytes": 5}, {"$bytes": "!!"}, {"$tuple": "x"},
                                  {"$dict": [[1]]}, {"$set": [[1]]}, {"$dict": [[[1], 2]]}])
def test_malformed_tags_are_protocol_errors(data: Any) -> None:
    """Unknown or malformed tags never decode to something half-right."""
    with pytest.raises(ProtocolError):
        decode_value(data)


def test_frame_reader_splits_partial_and_joined_frames() -> None:
    """Frames arriving in pieces or several at once come out whole and in order."""
    raw = frame({"t": "a"}) + frame({"t": "b"})
    reader = FrameReader()
    assert reader.feed(raw[:3]) == []
    assert reader.feed(raw[3:10]) == []
    assert [m["t"] for m in reader.feed(raw[10:])] == ["a", "b"]
    assert reader.pending == 0


@pytest.mark.parametrize("raw", [
    struct.pack(">I", MAX_MESSAGE + 1),
    struct.pack(">I", 3) + b"{{{",
    struct.pack(">I", 5) + b"[1,2]",
    struct.pack(">I", 2) + b"\xff\xfe",
    struct.pack(">I", 60000) + b"[" * 30000 + b"]" * 30000,
])
def test_frame_reader_refuses_bad_frames(raw: bytes) -> None:
    """Oversized announcements, bad JSON, non-objects and bad UTF-8 are protocol errors."""
    with pytest.raises(ProtocolError):
        FrameReader().feed(raw)


def test_oversized_outgoing_frame_is_refused() -> None:
    """Nothing larger than the limit is ever written."""
    with pytest.raises(EncodeError):
        frame({"v": "x" * (MAX_MESSAGE + 1)})


def test_well_formed_worker_messages_parse() -> None:
    """A call and a done message become typed requests."""
    call = parse_worker_message({"t": "call", "id": 3, "run": 1, "tool": "lookup", "args": {"order": {"$tuple": []}}})
    assert call == CallRequest(3, 1, "lookup", {"order": ()})
    done = parse_worker_message({"t": "done", "run": 1, "value": None, "error": None, "final": False, "cut": False,
                                 "key": "k"})
    assert isinstance(done, Done)


@pytest.mark.parametrize("message", [
    {"t": "reply", "id": 1, "ok": True, "value": 1},
    {"t": "run", "run": 1, "code": ""},
    {"t": 5},
    {"t": "call", "id": "1", "run": 1, "tool": "lookup", "args": {}},
    {"t": "call", "id": True, "run": 1, "tool": "lookup", "args": {}},
    {"t": "call", "id": -1, "run": 1, "tool": "lookup", "args": {}},
    {"t": "call", "id": 1, "run": 1, "tool": "lookup", "args": []},
    {"t": "call", "id": 1, "run": 1, "tool": "os.system", "args": {}},
    {"t": "call", "id": 1, "run": 1, "tool": "lookup", "args": {"$dict": [[1, 2]]}},
    {"t": "call", "id": 1, "run": 1, "tool": "lookup", "args": {}, "extra": 1},
    {"t": "call", "id": 1, "run": 1, "tool": "lookup"},
    {"t": "done", "run": 1, "value": None, "error": "boom", "final": False, "cut": False, "key": "k"},
    {"t": "done", "run": 1, "value": None, "error": None, "final": 1, "cut": False, "key": "k"},
    {"t": "done", "run": 1, "value": None, "error": {"type": "X", "message": 1, "line": None},
     "final": False, "cut": False, "key": "k"},
])
def test_unexpected_worker_messages_are_protocol_errors(message: dict[str, Any]) -> None:
    """Reply-type, unknown, mistyped or mis-shaped messages from a worker are refused."""
    with pytest.raises(ProtocolError):
        parse_worker_message(message)


def test_error_payload_carries_what_the_worker_needs() -> None:
    """Gate errors travel as class name, message and their specific fields."""
    budget = error_payload(BudgetExceeded("over", tool="t", call_id="c", rules=("r",), budget="b"))
    assert budget == {"type": "BudgetExceeded", "message": "over", "tool": "t", "call_id": "c", "rules": ["r"],
                      "budget": "b"}
    failed = error_payload(ToolFailed("boom", tool="t", error_type="ValueError"))
    assert failed["type"] == "ToolFailed" and failed["error_type"] == "ValueError"


def test_values_json_refuses_are_encode_errors() -> None:
    """An int beyond the conversion limit is an EncodeError, not a crash."""
    with pytest.raises(EncodeError):
        frame({"v": 10**5000})


_PAYLOADS = [None, True, False, 0, -7, 2**70, 1.5, float("nan"), "", "é \ud800 \"q\"\n", [1, "a"], {"a": [None]},
             encode_value((1, b"x", {2})), {"$tuple": [1]}]


@pytest.mark.parametrize("value", _PAYLOADS)
def test_call_and_reply_frames_are_the_bytes_frame_writes(value: Any) -> None:
    """The spelled-out call and reply frames equal `frame` of the same message, byte for byte."""
    assert reply_frame(7, value) == frame({"t": "reply", "id": 7, "ok": True, "value": value})
    args = {"x": value, "y": 1}
    assert call_frame(3, 2, "lookup", args) == frame({"t": "call", "id": 3, "run": 2, "tool": "lookup", "args": args})


def test_call_and_reply_frames_refuse_what_frame_refuses() -> None:
    """Too-big integers and oversized values are EncodeErrors from the spelled-out frames too."""
    for make in (lambda v: reply_frame(1, v), lambda v: call_frame(1, 1, "t", {"v": v})):
        with pytest.raises(EncodeError):
            make(10**5000)
    with pytest.raises(EncodeError):
        reply_frame(1, "x" * (MAX_MESSAGE + 1))


def test_an_oversized_call_still_leaves_the_worker() -> None:
    """A call over the frame limit is framed: the host refuses it by its size, and audits the refusal."""
    data = call_frame(1, 1, "t", {"v": "x" * (MAX_MESSAGE + 1)})
    assert len(data) > MAX_MESSAGE
