"""`iter_line_batches` yields exactly the lines `iter_lines` does, with the same line limit."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor.audit.lines import LongLine, iter_line_batches, iter_lines

_LINES = st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"x")), max_size=12)


@settings(max_examples=examples(500))
@given(lines=_LINES, newline_at_end=st.booleans(), limit=st.integers(1, 30), chunk=st.integers(1, 70),
       before=st.integers(0, 5))
def test_batches_are_the_lines_of_iter_lines(lines: list[bytes], newline_at_end: bool, limit: int, chunk: int,
                                             before: int) -> None:
    """Over any file, any limit and any read size: the same lines, over-long ones as the same `LongLine`
    (offset and length), in the same order; a file read from an offset reports offsets from the file's start."""
    data = b"p" * before + b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    one, two = io.BytesIO(data), io.BytesIO(data)
    one.seek(before)
    two.seek(before)
    expected = list(iter_lines(one, limit))
    assert [line for batch in iter_line_batches(two, limit, chunk) for line in batch] == expected


def test_a_line_over_the_limit_comes_back_as_a_marker() -> None:
    """A line of 100 KiB under a 1 KiB limit comes back as a marker, and the lines around it intact."""
    data = b"one\n" + b"x" * 100_000 + b"\nthree"
    out = [line for batch in iter_line_batches(io.BytesIO(data), 1024, 4096) for line in batch]
    assert out == [b"one", LongLine(4, 100_000), b"three"]
