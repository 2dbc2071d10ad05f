"""The channel's codec: rich values round-trip as themselves, and forged frames are refused in one line,
in bounded memory, before anything large is allocated (the worker is not trusted: it writes what it likes)."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hostile_frames import PRELUDE
from PIL import Image

from proctor.errors import ProctorError
from proctor.interpreter import Interpreter
from proctor.interpreter.channel import (
    EncodeError,
    ProtocolError,
    decode_value,
    encode_value,
    frame,
    parse,
    unsendable_return,
)


def wire(value: Any) -> Any:
    """`value` through the codec and a real frame, as the other side reads it."""
    return decode_value(parse(frame({"v": encode_value(value)})[4:])["v"])


@pytest.mark.parametrize("value", [
    dt.date(2024, 2, 29), dt.datetime(2024, 1, 2, 3, 4, 5, 6), dt.time(23, 59, 1),
    dt.datetime(2024, 1, 2, tzinfo=dt.timezone(dt.timedelta(hours=-5))), dt.timedelta(days=-3, seconds=7),
    decimal.Decimal("3.140"), decimal.Decimal("-1E+30"), {1, 2}, frozenset({"a"}), b"\x00\xff", (1, (2,)),
])
def test_standard_values_cross_as_themselves(value: Any) -> None:
    back = wire(value)
    assert type(back) is type(value) and back == value
    if isinstance(value, decimal.Decimal):
        assert str(back) == str(value)  # the exponent too: 3.140 stays 3.140


@pytest.mark.parametrize("array", [
    np.arange(12, dtype="int16").reshape(3, 4), np.array([True, False]), np.linspace(0, 1, 5, dtype="float32"),
    np.array([1 + 2j]), np.array(["2024-01-01", "NaT"], dtype="datetime64[s]"), np.zeros((0, 3)),
    np.arange(10, dtype=">i4")[::2], np.asfortranarray(np.ones((2, 3))),
])
def test_numpy_arrays_cross_with_dtype_and_shape(array: Any) -> None:
    back = wire(array)
    assert isinstance(back, np.ndarray) and back.dtype == array.dtype and back.shape == array.shape
    assert np.array_equal(back, array, equal_nan=array.dtype.kind in "fc") or array.dtype.kind == "M"
    back[...] = back  # writable: its own memory, not a view of the frame
    assert isinstance(wire(np.int64(7)), np.int64) and wire(np.float32(1.5)) == np.float32(1.5)


def test_pandas_objects_cross_with_their_columns_index_and_dtypes() -> None:
    df = pd.DataFrame({"team": ["a", "b", None], "points": [3, 4, 10], "share": [0.5, np.nan, 1.0],
                       "when": pd.to_datetime(["2024-01-01", "2024-02-01", None]),
                       "kind": pd.Categorical(["x", "y", "x"])}, index=pd.Index([7, 8, 9], name="id"))
    back = wire(df)
    assert isinstance(back, pd.DataFrame)
    pd.testing.assert_frame_equal(back, df, check_dtype=False)
    assert back["points"].dtype == np.int64 and back["kind"].dtype == "category" and back.index.name == "id"
    assert back.groupby("kind")["points"].sum().to_dict() == {"x": 13, "y": 4}
    series = pd.Series([1.5, 2.5], name="s", index=pd.RangeIndex(10, 12))
    pd.testing.assert_series_equal(wire(series), series)
    row = df.iloc[1]  # a row: named by its index label (a numpy int), of object dtype
    assert wire(row).name == 8 and wire(row)["points"] == 4
    pair = pd.Series([1], name=("a", 1))
    assert wire(pair).name == ("a", 1)
    assert wire(pd.DataFrame()).shape == (0, 0)


def test_pil_images_cross_as_images() -> None:
    image = Image.new("RGBA", (5, 3), (1, 2, 3, 4))
    back = wire(image)
    assert isinstance(back, Image.Image) and back.size == (5, 3) and back.tobytes() == image.tobytes()


@pytest.mark.parametrize("value, fix", [
    (np.array([object()]), "plain numeric dtypes only"),
    (np.array(["text"]), "plain numeric dtypes only"),
    (pd.DataFrame({"a": [1]}).set_index(pd.MultiIndex.from_tuples([(1, 2)])), "reset_index"),
    (object(), "cannot be sent"),
])
def test_what_cannot_cross_is_refused_by_the_encoder_naming_why(value: Any, fix: str) -> None:
    with pytest.raises(EncodeError, match=fix):
        encode_value(value, "result")


def b64(n: int) -> str:
    return base64.b64encode(b"\x00" * n).decode()


FORGED = [
    ({"$ndarray": {"dtype": "<f8", "shape": [10**9, 10**9], "data": b64(8)}}, "byte limit|sizes from 0"),
    ({"$ndarray": {"dtype": "<f8", "shape": [2**40], "data": b64(8)}}, "sizes from 0"),
    ({"$ndarray": {"dtype": "<f8", "shape": [-1], "data": ""}}, "sizes from 0"),
    ({"$ndarray": {"dtype": "|O", "shape": [1], "data": b64(8)}}, "not a plain numeric dtype"),
    ({"$ndarray": {"dtype": "<U4", "shape": [1], "data": b64(16)}}, "not a plain numeric dtype"),
    ({"$ndarray": {"dtype": "V8", "shape": [1], "data": b64(8)}}, "not a plain numeric dtype"),
    ({"$ndarray": {"dtype": "<f8", "shape": [3], "data": b64(8)}}, "24 expected"),
    ({"$ndarray": {"dtype": "<f8", "shape": [1] * 40, "data": b64(8)}}, "at most 32"),
    ({"$ndarray": {"dtype": "<f8", "shape": [1], "data": b64(8), "extra": 1}}, "exactly dtype"),
    ({"$npscalar": {"dtype": "<f8", "shape": [2], "data": b64(16)}}, "shape \\[\\]"),
    ({"$dataframe": {"columns": ["a"] * 20_000, "data": [{"dtype": "object", "values": []}] * 20_000,
                     "index": {"name": None, "range": [0, 0, 1]}}}, "over the limit of 10,000"),
    ({"$dataframe": {"columns": ["a", "b"], "data": [{"dtype": "object", "values": [1]},
                                                     {"dtype": "object", "values": [1, 2]}],
                     "index": {"name": None, "range": [0, 1, 1]}}}, "different lengths"),
    ({"$dataframe": {"columns": [], "data": [], "index": {"name": None, "range": [0, 10**12, 1]}}}, "over the limit"),
    ({"$series": {"name": None, "values": {"dtype": "|O", "values": {"$ndarray": {}}}, "index": {}}}, "dtype"),
    ({"$series": {"name": {"$set": [1]}, "values": {"dtype": "object", "values": [1]},
                  "index": {"name": None, "range": [0, 1, 1]}}}, "name must be a scalar"),
    ({"$series": {"name": None, "values": {"dtype": "float64; import os", "values": [1]},
                  "index": {"name": None, "range": [0, 1, 1]}}}, "must have dtype"),
    ({"$decimal": "9" * 5000}, "at most 1000"),
    ({"$decimal": "nonsense"}, "does not hold a number"),
    ({"$date": "2024-13-45"}, "\\$date"),
    ({"$datetime": "x" * 10_000}, "at most 100"),
    ({"$timedelta": [10**12, 0, 0]}, "within range"),
    ({"$image": {"format": "BMP", "data": ""}}, "must hold format"),
    ({"$image": {"format": "PNG", "data": b64(100)}}, "not a readable PNG"),
    ({"$bytes": "A" * (4 * (64 * 1024 * 1024 // 3 + 1) + 4)}, "over the"),
    ({"$what": 1}, "unknown value tag"),
]


@pytest.mark.parametrize("data, reason", FORGED)
def test_forged_values_are_refused_in_one_line_before_allocating(data: Any, reason: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=reason) as err:
            decode_value(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "\n" not in str(err.value)
    assert peak < 4 * len(json.dumps(data)) + 8 * 1024 * 1024  # what was sent, not what it claimed


def test_an_image_bomb_is_refused_from_its_header() -> None:
    """A PNG whose header claims 50,000 x 50,000 pixels: refused before its pixels are decoded."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 50_000, 50_000, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(b"\x00" * 1000)) + chunk(b"IEND", b""))
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match=r"pixels|not a readable"):
            decode_value({"$image": {"format": "PNG", "data": base64.b64encode(png).decode()}})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024



@pytest.mark.parametrize("data, reason", [
    ({"$ndarray": {"dtype": "<f8", "shape": [10**7, 10**7], "data": "AAAAAAAAAAA="}}, "byte limit"),
    ({"$ndarray": {"dtype": "|O", "shape": [1], "data": "AAAAAAAAAAA="}}, "not a plain numeric dtype"),
    ({"$dataframe": {"columns": [], "data": [], "index": {"name": None, "range": [0, 10**12, 1]}}}, "over the limit"),
])
def test_a_hostile_worker_forging_codec_frames_loses_the_run_not_the_host(
        make: Callable[..., Interpreter], data: Any, reason: str) -> None:
    """The frames come from the worker itself, as arguments of a call: the host refuses them, in one line."""
    interp = make(sandbox="process", authorized_imports=["os", "stat", "struct", "json"], timeout=10)
    program = (PRELUDE + f"msg({{'t': 'call', 'id': 1, 'run': {interp._seq + 1}, 'tool': 'lookup', "
               f"'args': {{'order': {data!r}}}}})\nimport time\n")
    tracemalloc.start()
    try:
        r = interp.run(program.replace("import time\n", "") + "x = lookup('y')")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(r.error, ProctorError)
    assert any(part in str(r.error) for part in reason.split("|")) and "\n" not in str(r.error)
    assert peak < 32 * 1024 * 1024
    assert interp.run("6 * 7").value == 42


class Record:
    pass


def test_the_return_annotation_says_before_the_call_what_cannot_cross() -> None:
    assert unsendable_return(pd.DataFrame, True) is None
    assert "authorize it (authorized_imports=['pandas'])" in str(unsendable_return(pd.DataFrame, False))
    assert "authorized_imports=['numpy']" in str(unsendable_return(np.ndarray, False))
    assert "a Record, cannot be sent" in str(unsendable_return(Record, True))
    import inspect
    from collections.abc import Mapping

    for fine in (dict, list, str, dt.date, decimal.Decimal, Any, "DataFrame", dict[str, Record], None,
                 inspect.Signature.empty, Mapping, type(None), bool):
        assert unsendable_return(fine, False) is None
