"""`new_id`: 128 random bits in hex, never repeated across a fork."""

from __future__ import annotations

import os
import re
import warnings

import pytest

from proctor.calls import new_id


def test_ids_are_prefixed_hex_and_distinct() -> None:
    """Ids are the prefix and 32 hex digits; 20,000 in a row are all different (the pool refills)."""
    ids = [new_id("call_") for _ in range(20_000)]
    assert all(re.fullmatch(r"call_[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.process
def test_a_forked_child_does_not_repeat_its_parents_ids() -> None:
    """The child forgets the parent's pooled random bytes: its next id differs from the parent's next."""
    new_id()
    read, write = os.pipe()
    with warnings.catch_warnings():  # Python 3.12+ warns about forking a process that has threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, new_id().encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 100).decode()
    os.close(read)
    assert child != new_id()
