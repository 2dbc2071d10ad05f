"""The wire between the host and the worker: length-prefixed JSON, nothing else.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON
(one object). Values that JSON cannot carry are tagged objects of one key (the table is
`TAGS`; docs/sandbox.md, "Wire format", is the reference):

- ``{"$bytes": base64}``, ``{"$tuple": [...]}``, ``{"$set": [...]}``, ``{"$frozenset": [...]}``
  and ``{"$dict": [[key, value], ...]}`` (dicts with non-string keys, or a user dict that
  happens to look like a tag);
- ``{"$date": "2024-01-02"}``, ``{"$datetime": iso}``, ``{"$time": iso}``,
  ``{"$timedelta": [days, seconds, microseconds]}``, ``{"$decimal": "1.10"}``;
- ``{"$ndarray": {"dtype", "shape", "data"}}`` and ``{"$npscalar": …}``: numpy arrays and
  scalars of plain numeric dtypes (bool, ints, floats, complex, datetime64, timedelta64) as
  their raw bytes; never object, string or structured dtypes;
- ``{"$series": …}``, ``{"$dataframe": …}``: pandas objects as named columns, each a
  numeric array as above or a list of plain values, with their index;
- ``{"$image": {"format", "data"}}``: a PIL image as PNG (or its own PNG/JPEG/GIF/WebP) bytes.

Nothing is ever pickled and no constructor is looked up by name: each tag has its own
decoder, which checks the sizes it is given (shape against bytes, text lengths, column and
row counts, pixels) before allocating, and refuses anything else with a `ProtocolError`
saying what. numpy, pandas and Pillow are imported only when a value of theirs is met.

This module is imported by the worker too, so it uses the standard library only
and stays cheap to import.
"""

from __future__ import annotations

import base64
import json
import json.encoder
import os
import re
import select
import struct
import sys
import time

from proctor.errors import EncodeError, ProtocolError

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
    "TAGS",
    "call_frame",
    "count_values",
    "decode_value",
    "encode_value",
    "frame",
    "parse",
    "reply_frame",
    "unsendable_return",
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


_TAGS = ("$bytes", "$tuple", "$set", "$frozenset", "$dict", "$date", "$datetime", "$time", "$timedelta", "$decimal",
         "$ndarray", "$npscalar", "$series", "$dataframe", "$image")
#: Every tag a value may carry on the wire.
TAGS = frozenset(_TAGS)
#: Largest raw buffer (an array's bytes, an image's file) a value may carry.
MAX_BUFFER = 64 * 1024 * 1024
#: Most dimensions of an array, columns of a DataFrame, characters of a date, time or Decimal.
MAX_NDIM = 32
MAX_COLUMNS = 10_000
MAX_TEXT = 100
MAX_DECIMAL = 1_000
#: Most pixels of an image (width x height), checked from its header before it is decoded.
MAX_PIXELS = 25_000_000
#: The numpy dtypes that cross: byte order, then bool, ints, floats, complex, datetime64/timedelta64 with a unit.
_DTYPE = re.compile(r"[<>|=]?(?:b1|[iu][1248]|f[248]|c(?:8|16)|[Mm]8\[(?:Y|M|W|D|h|m|s|ms|us|ns)\])\Z")
#: The dtypes of a pandas column carried as a list of values (anything else numeric is an array).
_LIST_DTYPES = frozenset({"object", "str", "string", "category", "bool", "boolean"})
_IMAGE_FORMATS = frozenset({"PNG", "JPEG", "GIF", "WEBP"})
_SCALARS = (str, int, float, bool, type(None))
#: The exact types a value may have to cross the channel as itself, untagged.
SCALAR_TYPES = frozenset(_SCALARS)


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
    rich = _encode_rich(value, d)
    if rich is not _NOT_RICH:
        return rich
    raise _Unencodable(
        f"{{where}} of type {type(value).__name__} cannot be sent: use str, int, float, bool, None, bytes, list, "
        "tuple, set, dict, date, datetime, time, timedelta, Decimal, numpy arrays of numbers, pandas "
        "DataFrame/Series or PIL images"
    )


_NOT_RICH: Any = object()


def _encode_rich(value: Any, depth: int) -> Any:
    """The tag of a date, Decimal, numpy, pandas or PIL value; `_NOT_RICH` for anything else.

    Each library is looked up in ``sys.modules``, never imported: a value of it exists only once it is.
    """
    dt = sys.modules.get("datetime")
    if dt is not None:
        if isinstance(value, dt.datetime):
            return {"$datetime": dt.datetime.isoformat(value)}  # the base method: a pandas Timestamp too
        if isinstance(value, dt.date):
            return {"$date": dt.date.isoformat(value)}
        if isinstance(value, dt.time):
            return {"$time": dt.time.isoformat(value)}
        if isinstance(value, dt.timedelta):
            return {"$timedelta": [value.days, value.seconds, value.microseconds]}
    dec = sys.modules.get("decimal")
    if dec is not None and isinstance(value, dec.Decimal):
        return {"$decimal": str(value)}
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(value, np.ndarray):
            return {"$ndarray": _array_body(value)}
        if isinstance(value, np.generic):
            return {"$npscalar": _array_body(np.asarray(value))}
    pd = sys.modules.get("pandas")
    if pd is not None:
        if isinstance(value, pd.DataFrame):
            if value.columns.nlevels != 1 or len(value.columns) > MAX_COLUMNS:
                raise _Unencodable(f"{{where}}: a DataFrame crosses with at most {MAX_COLUMNS} columns of one level")
            columns = [_encode(c, depth) for c in value.columns]
            data = [_column(value.iloc[:, i], depth) for i in range(value.shape[1])]
            return {"$dataframe": {"columns": columns, "data": data, "index": _index(value.index, depth)}}
        if isinstance(value, pd.Series):
            return {"$series": {"name": _encode(value.name, depth), "values": _column(value, depth),
                                "index": _index(value.index, depth)}}
    pil = sys.modules.get("PIL.Image")
    if pil is not None and isinstance(value, pil.Image):
        return {"$image": _image_body(value)}
    return _NOT_RICH


#: Classes whose values cross (with their subclasses), by module and name; the libraries' need the worker
#: to import them (`unsendable_return`).
_SENDABLE = frozenset({
    ("builtins", n) for n in ("str", "int", "float", "bool", "NoneType", "bytes", "bytearray", "list", "tuple",
                              "dict", "set", "frozenset", "object")
} | {("datetime", n) for n in ("date", "datetime", "time", "timedelta")} | {("decimal", "Decimal")})
#: Modules of annotations that name no class of value: ``typing.Any`` (a class since 3.11), ``inspect``'s
#: "no annotation" marker, abstract collections and protocols.
_SAYS_NOTHING = frozenset({"typing", "typing_extensions", "inspect", "collections.abc", "types", "abc"})
_LIBRARY_TYPES = {"numpy": ("ndarray", "generic"), "pandas": ("DataFrame", "Series"), "PIL": ("Image",)}


def unsendable_return(annotation: Any, third_party: bool) -> str | None:
    """Why a tool whose return annotation is `annotation` cannot answer a program, or None when it may.

    Only a plain class decides: a subclass of nothing that crosses (``-> MyRecord``), or a numpy, pandas
    or PIL type when the worker cannot import those (`third_party` false: no third-party module is
    authorized, so the sandbox has no site-packages). Unions, generics, ``Any`` and strings say nothing.
    """
    if not isinstance(annotation, type) or annotation.__module__ in _SAYS_NOTHING:
        return None
    library = None
    for cls in annotation.__mro__:
        module, name = cls.__module__, cls.__qualname__
        top = module.partition(".")[0]
        if (module, name) in _SENDABLE and cls is not object:
            return None
        if top in _LIBRARY_TYPES and name in _LIBRARY_TYPES[top]:
            library = top
            break
    if library is None:
        return (f"its result, a {annotation.__qualname__}, cannot be sent to the program (see docs/sandbox.md, "
                "Wire format): return data (dict, list, str, numbers, dates, numpy/pandas objects)")
    if not third_party:
        return (f"its result, a {library} {annotation.__qualname__}, can reach the program only with {library} in "
                f"the sandbox: authorize it (authorized_imports=[{library!r}])")
    return None


def _array_body(array: Any) -> dict[str, Any]:
    dtype = array.dtype.str
    if not _DTYPE.match(dtype):
        raise _Unencodable(f"{{where}}: a numpy array of dtype {array.dtype} cannot be sent (plain numeric dtypes "
                           "only: bool, ints, floats, complex, datetime64, timedelta64); convert it with .tolist()")
    data = array.tobytes()  # C order, whatever the array's layout
    if len(data) > MAX_BUFFER:
        raise _Unencodable(f"{{where}}: a numpy array of {len(data):,} bytes is over the {MAX_BUFFER:,}-byte limit")
    return {"dtype": dtype, "shape": list(array.shape), "data": base64.b64encode(data).decode("ascii")}


def _column(series: Any, depth: int) -> dict[str, Any]:
    np = sys.modules["numpy"]
    dtype = series.dtype
    if isinstance(dtype, np.dtype) and _DTYPE.match(dtype.str):
        return {"dtype": dtype.str, "values": {"$ndarray": _array_body(series.to_numpy())}}
    name = str(dtype)
    return {"dtype": name if name in _LIST_DTYPES else "object",
            "values": [_encode(_plain(v), depth + 1) for v in series.tolist()]}


def _plain(value: Any) -> Any:
    """pandas' missing value as None (it has no wire form); anything else as it is."""
    pd = sys.modules["pandas"]
    return None if value is pd.NA or value is pd.NaT else value


def _index(index: Any, depth: int) -> dict[str, Any]:
    pd = sys.modules["pandas"]
    if index.nlevels != 1:
        raise _Unencodable("{where}: a pandas object with a MultiIndex cannot be sent; reset_index() it first")
    name = _encode(index.name, depth)
    if isinstance(index, pd.RangeIndex):
        return {"name": name, "range": [index.start, index.stop, index.step]}
    return {"name": name, "values": _column(index.to_series(), depth)}


def _image_body(image: Any) -> dict[str, Any]:
    import io

    fmt = "PNG"  # lossless, whatever the image was read from
    out = io.BytesIO()
    try:
        if image.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):
            image = image.convert("RGBA" if "A" in image.mode else "RGB")
        image.save(out, format="PNG")
    except Exception as exc:  # noqa: BLE001 - an image Pillow cannot write
        raise _Unencodable(f"{{where}}: the image cannot be encoded ({type(exc).__name__}: {exc})") from None
    data = out.getvalue()
    if len(data) > MAX_BUFFER:
        raise _Unencodable(f"{{where}}: an image of {len(data):,} bytes is over the {MAX_BUFFER:,}-byte limit")
    return {"format": fmt, "data": base64.b64encode(data).decode("ascii")}


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
        return _b64(inner, tag)
    if tag in _RICH_DECODERS:
        return _RICH_DECODERS[tag](inner, depth, limit)
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


def _b64(text: Any, tag: str, limit: int = 0) -> bytes:
    """The bytes of a base64 field, refused unread when its length says they would pass `limit`."""
    limit = limit or MAX_BUFFER
    if not isinstance(text, str):
        raise ProtocolError(f"{tag} must hold a base64 string")
    if len(text) > 4 * (limit // 3 + 1):
        raise ProtocolError(f"{tag}: {len(text):,} characters of base64 is over the {limit:,}-byte limit")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except ValueError as exc:
        raise ProtocolError(f"{tag} is not valid base64: {exc}") from None


def _text(inner: Any, tag: str, most: int = 0) -> str:
    most = most or MAX_TEXT
    if not isinstance(inner, str) or len(inner) > most:
        raise ProtocolError(f"{tag} must hold a string of at most {most} characters")
    return inner


def _library(name: str, tag: str) -> Any:
    """numpy, pandas or PIL.Image, imported for a value that needs it; `ProtocolError` where it cannot be."""
    try:
        return __import__(name, fromlist=["_"])
    except ImportError:
        top = name.partition(".")[0]
        raise ProtocolError(f"a {tag[1:]} value arrived, but {top} cannot be imported here: install it (on the "
                            f"host), and authorize it (authorized_imports=[{top!r}]) for the sandbox to receive "
                            "it") from None


def _decode_when(tag: str, inner: Any) -> Any:
    import datetime as dt

    try:
        if tag == "$date":
            return dt.date.fromisoformat(_text(inner, tag))
        if tag == "$datetime":
            return dt.datetime.fromisoformat(_text(inner, tag))
        if tag == "$time":
            return dt.time.fromisoformat(_text(inner, tag))
        if (not isinstance(inner, list) or len(inner) != 3 or any(type(v) is not int for v in inner)
                or abs(inner[0]) > 999_999_999 or not 0 <= inner[1] < 86_400 or not 0 <= inner[2] < 1_000_000):
            raise ProtocolError("$timedelta must hold [days, seconds, microseconds] within range")
        return dt.timedelta(days=inner[0], seconds=inner[1], microseconds=inner[2])
    except (ValueError, OverflowError) as exc:
        raise ProtocolError(f"{tag}: {exc}") from None


def _decode_decimal(inner: Any, depth: int, limit: int) -> Any:
    import decimal

    text = _text(inner, "$decimal", MAX_DECIMAL)
    try:
        return decimal.Decimal(text)
    except decimal.InvalidOperation:
        raise ProtocolError("$decimal does not hold a number") from None


def _decode_array(inner: Any, tag: str) -> Any:
    """An ndarray from dtype, shape and bytes, every size checked before anything is allocated."""
    if not isinstance(inner, dict) or set(inner) != {"dtype", "shape", "data"}:
        raise ProtocolError(f"{tag} must hold exactly dtype, shape and data")
    dtype, shape, data = inner["dtype"], inner["shape"], inner["data"]
    if not isinstance(dtype, str) or not _DTYPE.match(dtype):
        raise ProtocolError(f"{tag}: dtype {str(dtype)[:40]!r} is not a plain numeric dtype")
    if (not isinstance(shape, list) or len(shape) > MAX_NDIM
            or any(type(n) is not int or n < 0 or n > MAX_BUFFER for n in shape)):
        raise ProtocolError(f"{tag}: shape must be a list of at most {MAX_NDIM} sizes from 0 to {MAX_BUFFER:,}")
    np = _library("numpy", tag)
    itemsize = np.dtype(dtype).itemsize
    count = 1
    for n in shape:
        count *= n
        if count * itemsize > MAX_BUFFER:
            raise ProtocolError(f"{tag}: shape {shape[:8]} holds more than the {MAX_BUFFER:,}-byte limit")
    raw = _b64(data, tag)
    if len(raw) != count * itemsize:
        raise ProtocolError(f"{tag}: {len(raw):,} bytes of data for shape {shape[:8]} of {dtype} "
                            f"({count * itemsize:,} expected)")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()  # its own writable memory


def _decode_ndarray(inner: Any, depth: int, limit: int) -> Any:
    return _decode_array(inner, "$ndarray")


def _decode_npscalar(inner: Any, depth: int, limit: int) -> Any:
    array = _decode_array(inner, "$npscalar")
    if array.shape != ():
        raise ProtocolError("$npscalar must have shape []")
    return array[()]


def _decode_column(inner: Any, depth: int, limit: int, pd: Any) -> Any:
    if not isinstance(inner, dict) or set(inner) != {"dtype", "values"}:
        raise ProtocolError("a pandas column must hold exactly dtype and values")
    dtype, values = inner["dtype"], inner["values"]
    if isinstance(values, list):
        if dtype not in _LIST_DTYPES:
            raise ProtocolError(f"a pandas column of values must have dtype {', '.join(sorted(_LIST_DTYPES))}")
        items = [decode_value(v, depth + 1, limit) for v in values]
        return pd.Series(items, dtype=None if dtype in ("object", "str") else dtype)
    if not (isinstance(values, dict) and set(values) == {"$ndarray"}) or values["$ndarray"].get("dtype") != dtype:
        raise ProtocolError("a pandas column must hold a list or an $ndarray of its dtype")
    return pd.Series(_decode_array(values["$ndarray"], "$ndarray"), copy=False)


def _decode_index(inner: Any, depth: int, limit: int, pd: Any, length: int) -> Any:
    if not isinstance(inner, dict) or not ({"name", "range"} == set(inner) or {"name", "values"} == set(inner)):
        raise ProtocolError("a pandas index must hold name and range, or name and values")
    name = decode_value(inner["name"], depth + 1, limit)
    if "range" in inner:
        bounds = inner["range"]
        if not isinstance(bounds, list) or len(bounds) != 3 or any(type(b) is not int for b in bounds) or not bounds[2]:
            raise ProtocolError("a RangeIndex must hold [start, stop, step] with a step other than 0")
        index = pd.RangeIndex(*bounds, name=name)
    else:
        index = pd.Index(_decode_column(inner["values"], depth, limit, pd), name=name)
    if len(index) != length:
        raise ProtocolError(f"a pandas index of {len(index):,} entries for {length:,} rows")
    return index


def _scalar_name(value: Any, what: str) -> Any:
    """A pandas label: a scalar (a number, text, a date, a numpy scalar…) or a tuple of them, never a container."""
    if isinstance(value, tuple):
        for item in value:
            _scalar_name(item, what)
        return value
    if isinstance(value, (list, dict, set, frozenset, bytes)) or (hasattr(value, "shape") and value.shape != ()):
        raise ProtocolError(f"{what} must be a scalar or a tuple of scalars, not a {type(value).__name__}")
    return value


def _decode_series(inner: Any, depth: int, limit: int) -> Any:
    if not isinstance(inner, dict) or set(inner) != {"name", "values", "index"}:
        raise ProtocolError("$series must hold exactly name, values and index")
    pd = _library("pandas", "$series")
    values = _decode_column(inner["values"], depth, limit, pd)
    values.index = _decode_index(inner["index"], depth, limit, pd, len(values))
    values.name = _scalar_name(decode_value(inner["name"], depth + 1, limit), "a Series' name")
    return values


def _decode_dataframe(inner: Any, depth: int, limit: int) -> Any:
    if not isinstance(inner, dict) or set(inner) != {"columns", "data", "index"}:
        raise ProtocolError("$dataframe must hold exactly columns, data and index")
    columns, data = inner["columns"], inner["data"]
    if not isinstance(columns, list) or not isinstance(data, list) or len(columns) != len(data):
        raise ProtocolError("$dataframe: columns and data must be lists of the same length")
    if len(columns) > MAX_COLUMNS:
        raise ProtocolError(f"$dataframe: {len(columns):,} columns is over the limit of {MAX_COLUMNS:,}")
    pd = _library("pandas", "$dataframe")
    names = [_scalar_name(decode_value(c, depth + 1, limit), "a column name") for c in columns]
    series = [_decode_column(c, depth, limit, pd) for c in data]
    rows = {len(s) for s in series}
    if len(rows) > 1:
        raise ProtocolError("$dataframe: its columns are of different lengths")
    length = rows.pop() if rows else _index_length(inner["index"])
    index = _decode_index(inner["index"], depth, limit, pd, length)
    if not series:
        return pd.DataFrame(index=index)
    frame = pd.DataFrame(dict(enumerate(series)), copy=False)  # by position: names may repeat
    frame.columns = pd.Index(names, dtype=object) if len(set(map(type, names))) > 1 else pd.Index(names)
    frame.index = index
    return frame


def _index_length(inner: Any) -> int:
    """Rows of a DataFrame without columns: its index's length (a range's is computed, not built)."""
    if isinstance(inner, dict) and isinstance(inner.get("range"), list) and len(inner["range"]) == 3 \
            and all(type(b) is int for b in inner["range"]) and inner["range"][2]:
        start, stop, step = inner["range"]
        n = len(range(start, stop, step))
        if n > MAX_BUFFER:
            raise ProtocolError(f"a RangeIndex of {n:,} rows is over the limit of {MAX_BUFFER:,}")
        return n
    values = inner.get("values") if isinstance(inner, dict) else None
    listed = values.get("values") if isinstance(values, dict) else None
    return len(listed) if isinstance(listed, list) else -1


def _decode_image(inner: Any, depth: int, limit: int) -> Any:
    """A PIL image from its encoded bytes: format and pixel count read from the header before decoding."""
    if not isinstance(inner, dict) or set(inner) != {"format", "data"} or inner["format"] not in _IMAGE_FORMATS:
        raise ProtocolError(f"$image must hold format ({', '.join(sorted(_IMAGE_FORMATS))}) and data")
    raw = _b64(inner["data"], "$image")
    pil = _library("PIL.Image", "$image")
    import io

    try:
        image = pil.open(io.BytesIO(raw), formats=[inner["format"]])
        width, height = image.size
        if width * height > MAX_PIXELS:
            raise ProtocolError(f"$image: {width}x{height} pixels is over the limit of {MAX_PIXELS:,}")
        image.load()
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds for a bad file
        raise ProtocolError(f"$image: not a readable {inner['format']} image ({type(exc).__name__})") from None
    return image


_RICH_DECODERS: dict[str, Any] = {
    "$date": lambda inner, depth, limit: _decode_when("$date", inner),
    "$datetime": lambda inner, depth, limit: _decode_when("$datetime", inner),
    "$time": lambda inner, depth, limit: _decode_when("$time", inner),
    "$timedelta": lambda inner, depth, limit: _decode_when("$timedelta", inner),
    "$decimal": _decode_decimal,
    "$ndarray": _decode_ndarray,
    "$npscalar": _decode_npscalar,
    "$series": _decode_series,
    "$dataframe": _decode_dataframe,
    "$image": _decode_image,
}


def frame(message: dict[str, Any]) -> bytes:
    """One frame holding `message` (already made of JSON-safe data)."""
    try:
        return _framed(_dumps(message))
    except (ValueError, TypeError, RecursionError) as exc:  # e.g. an int past the 4300-digit limit
        raise EncodeError(f"message cannot be encoded: {str(exc)[:200]}") from None


# The two frames of every tool call, spelled out: the encoder's set-up costs more than the
# message (15k instructions for a reply holding "a", 4k this way). Same bytes as `frame`
# of the same dict, key order included (tested).
def call_frame(rid: int, run: int, tool: str, args: dict[str, Any], at: str = "") -> bytes:
    """`frame({"t": "call", "id": rid, "run": run, "tool": tool, "at": at, "args": args})`, sooner (`_json`
    and `_framed` inline: the worker's every call). `at` is where the program made the call,
    ``LINE:COL:END_LINE:END_COL`` (or ``LINE``), left out when empty; it comes before the arguments so
    the host reads it in a frame's head, whatever the arguments' size."""
    try:
        where = f'"at":{_ESCAPE(at)},' if at else ""
        body = (f'{{"t":"call","id":{int(rid)},"run":{int(run)},"tool":{_ESCAPE(tool)},{where}'
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
