"""Properties: any single-byte change is caught at or before its record; any JSON-able fields round-trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from audit_helpers import built, signing_key
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor.audit import AuditLog, verify


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, bytes]:
    work = tmp_path_factory.mktemp("property")
    data, side = built(work, 8)
    return work, data, side


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_single_byte_change_is_detected_at_or_before_its_record(
    template: tuple[Path, bytes, bytes], data: st.DataObject
) -> None:
    """Changing one byte anywhere makes verify fail at the record holding that byte or earlier."""
    work, log, side = template
    pos = data.draw(st.integers(0, len(log) - 1), label="position")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != log[pos]), label="byte")
    edited = log[:pos] + bytes([new]) + log[pos + 1 :]
    path = work / "edited.jsonl"
    path.write_bytes(edited)
    Path(str(path) + ".checkpoint").write_bytes(side)
    report = verify(path, pubkey=signing_key().public_key())
    record = log[:pos].count(b"\n")
    assert report.failure is not None, f"byte {pos} -> {new:#x} not detected"
    assert report.failure.seq <= record, report.failure


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text() | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.dictionaries(st.text(max_size=10), json_values, max_size=5), min_size=1, max_size=5))
def test_any_jsonable_fields_round_trip_through_verify(tmp_path: Path, batches: list[dict[str, Any]]) -> None:
    """Whatever the gate stores (unicode, control characters, big ints, floats), writer and verifier agree."""
    path = tmp_path / "p.jsonl"
    for p in tmp_path.glob("p.jsonl*"):
        p.unlink()
    with AuditLog(path, durability="flush") as log:
        for fields in batches:
            clean = {k: v for k, v in fields.items() if k not in ("seq", "ts_ns", "kind", "prev", "h")}
            result = log.append("step", {"payload": clean})
            assert result.ok or "cannot encode" in str(result.error)  # lone surrogates cannot be UTF-8
    report = verify(path)
    assert report.ok, report.failure
