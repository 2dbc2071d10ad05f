"""Tests for proctor.canonical and proctor.redaction."""

from __future__ import annotations

import pytest

from proctor.canonical import canonical_bytes, canonical_sha256
from proctor.redaction import redact_args


def test_canonical_bytes_sort_and_compact() -> None:
    """Keys are sorted, separators compact, text UTF-8."""
    assert canonical_bytes({"b": 1, "a": ["é", None, True]}) == '{"a":["é",null,true],"b":1}'.encode()


def test_floats_bytes_tuples_and_sets_are_tagged() -> None:
    """No float is written as a JSON number; bytes, tuples and sets have one encoding each."""
    assert canonical_bytes({"x": 1.5}) == b'{"x":{"$float":"1.5"}}'
    assert canonical_bytes(b"\x00") == b'{"$bytes":"AA=="}'
    assert canonical_bytes((1, 2)) == canonical_bytes([1, 2])
    assert canonical_bytes({3, 1, 2}) == b"[1,2,3]"


def test_unknown_types_are_refused() -> None:
    """Objects without a canonical form are an error, not a repr."""
    with pytest.raises(TypeError, match="cannot put a object"):
        canonical_bytes(object())
    with pytest.raises(TypeError, match="string keys"):
        canonical_bytes({1: 2})


def test_hash_ignores_key_order() -> None:
    """Equal mappings hash equal whatever their insertion order."""
    assert canonical_sha256({"a": 1, "b": 2}) == canonical_sha256({"b": 2, "a": 1})


def test_redaction_hides_values_but_keeps_them_correlatable() -> None:
    """Equal secrets give equal marks under one key and different marks under another."""
    a = redact_args({"card": "4111", "amount": 5}, ["card"], b"k1")
    b = redact_args({"card": "4111", "amount": 7}, ["card"], b"k1")
    c = redact_args({"card": "4111", "amount": 5}, ["card"], b"k2")
    assert "4111" not in str(a.args)
    assert a.args["amount"] == 5
    assert a.args["card"] == b.args["card"] != c.args["card"]
    assert a.digest != b.digest


def test_redaction_follows_dotted_paths_and_ignores_absent_fields() -> None:
    """A dotted path redacts inside nested mappings; a missing field is left alone."""
    r = redact_args({"payment": {"card": "4111", "cvv": "123"}}, ["payment.cvv", "nothere"], b"k")
    assert r.args["payment"]["card"] == "4111"
    assert set(r.args["payment"]["cvv"]) == {"$redacted"}


def test_enum_and_subclass_values_become_plain_values() -> None:
    """A str or int enum is written as its value, exactly as json writes it."""
    import enum

    class Color(str, enum.Enum):
        RED = "red"

    class Level(enum.IntEnum):
        HIGH = 3

    assert canonical_bytes({"c": Color.RED, "l": Level.HIGH, Color.RED: 1}) == b'{"c":"red","l":3,"red":1}'


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": "x\n\t\"\\\x00\x1f\x7f\u2028\U0001f600é"},
        {"big": 2**70, "neg": -(2**70)},
        {"nested": [[[[{"k": [True, None, False]}]]]]},
        [],
        "",
    ],
)
def test_fast_and_exact_encoders_agree(value: object) -> None:
    """Whatever path encodes a value, the bytes are json's canonical ones."""
    import json

    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert canonical_bytes(value) == expected


def test_lone_surrogates_are_refused_with_a_reason() -> None:
    """Text that is not valid Unicode has no UTF-8 form: a ValueError says so."""
    with pytest.raises(ValueError, match="lone surrogate"):
        canonical_bytes({"x": "\ud800"})


def test_redaction_without_digest() -> None:
    """digest=False redacts the same fields and leaves the digest empty."""
    r = redact_args({"card": "4111"}, ["card"], b"k", digest=False)
    assert r.digest == "" and r.args == redact_args({"card": "4111"}, ["card"], b"k").args
