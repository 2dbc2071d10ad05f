"""Edited arguments are checked against the tool's schema as stored with the approval, without fetching anything."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from internal_host import internal_host

from proctor.approval.answers import check_edit
from proctor.errors import InvalidAnswer
from proctor.store.base import PendingApproval


@pytest.fixture
def internal() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on localhost standing for an internal host; the paths it was asked for."""
    with internal_host() as served:
        yield served


def _approval(parameters: dict[str, object]) -> PendingApproval:
    return PendingApproval(id="appr_1", run_id="run_1", call_id="call_1", tool="peek", binding="b",
                           policy_sha256="0" * 64, args={"x": "old"}, parameters=parameters)


@pytest.mark.server
def test_an_edit_is_checked_without_fetching_a_reference_the_schema_makes(internal: tuple[str, list[str]]) -> None:
    """The schema came from the tool (an MCP server's: anyone's): a `$ref` to a URL must not make `proctor serve`
    fetch it when an approver edits an argument; the edit is refused, naming the reference."""
    base, fetched = internal
    schema = {"type": "object", "properties": {"x": {"$ref": f"{base}/metadata.json"}}}
    with pytest.raises(InvalidAnswer, match="outside itself"):
        check_edit(_approval(schema), {"x": "new"})
    assert fetched == []


def test_an_edit_is_still_checked_against_a_schema_that_refers_within_itself() -> None:
    schema = {"type": "object", "$defs": {"N": {"type": "integer"}}, "properties": {"x": {"$ref": "#/$defs/N"}}}
    assert check_edit(_approval(schema), {"x": 3}) == {"x": 3}
    with pytest.raises(InvalidAnswer, match="x: 'new' is not of type 'integer'"):
        check_edit(_approval(schema), {"x": "new"})
