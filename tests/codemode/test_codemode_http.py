"""`proctor mcp serve --http` with bearer tokens, driven by the mcp SDK's own client."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import mcp.types as mt
import pytest

from codemode.helpers import audit_records, free_port, http_server, http_session, serve_args, text, write_config
from proctor.serve.tokens import add_token


@pytest.fixture
def served(tmp_path: Path) -> Any:
    servers, policy, audit = write_config(tmp_path)
    tokens = tmp_path / "tokens.txt"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    port = free_port()
    args = serve_args(servers, policy, audit, "--http", f"127.0.0.1:{port}", "--tokens", str(tokens))
    with http_server(args, port):
        yield f"http://127.0.0.1:{port}/mcp", {"alice": alice, "bob": bob}, audit


def test_without_a_valid_token_nothing_is_served(served: Any) -> None:
    url, _, _ = served
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    assert httpx.post(url, json=body).status_code == 401
    assert httpx.post(url, json=body, headers={"Authorization": "Bearer nope"}).status_code == 401


def test_the_tokens_owner_is_the_runs_principal_and_approvals_are_elicited(served: Any) -> None:
    url, tokens, audit = served
    asked: list[str] = []

    async def approve(context: Any, params: Any) -> Any:
        asked.append(params.model_dump(by_alias=True).get("message", ""))
        return mt.ElicitResult(action="accept", content={"approve": True, "reason": "fine"})

    async def go() -> tuple[str, str]:
        async with http_session(url, tokens["bob"], approve) as s:
            first = text(await s.call_tool("run_python", {"code": "w = t_get_weather('Oslo')\nw"}))
            second = text(await s.call_tool("run_python", {"code": "(w, t_delete_file('/tmp/y'))"}))
            return first, second

    first, second = asyncio.run(go())
    assert "value: 'sunny in Oslo (metric)'" in first
    assert "'deleted /tmp/y'" in second and len(asked) == 1 and "t_delete_file" in asked[0]
    records = audit_records(audit)
    started = [r for r in records if r["kind"] == "run_started"]
    assert [r["principal"] for r in started] == ["bob"]
    intents = [r for r in records if r["kind"] == "call_intent"]
    assert {r["run_id"] for r in intents} == {started[0]["run_id"]} and len(intents) == 2
    approvals = [r for r in records if r["kind"] == "approval_resolved"]
    assert [(a["verdict"], a["approver"]) for a in approvals] == [("approve", "mcp-elicitation:bob")]
    # The client ended its session (DELETE): the run is finished.
    assert [r["run_id"] for r in records if r["kind"] == "run_finished"] == [started[0]["run_id"]]


def test_two_sessions_are_two_runs(served: Any) -> None:
    url, tokens, audit = served

    async def one(token: str) -> str:
        async with http_session(url, token) as s:
            return text(await s.call_tool("run_python", {"code": "t_add(1, 2)"}))

    async def go() -> list[str]:
        return list(await asyncio.gather(one(tokens["alice"]), one(tokens["bob"])))

    assert all("value: 3" in out for out in asyncio.run(go()))
    started = [r for r in audit_records(audit) if r["kind"] == "run_started"]
    assert sorted(r["principal"] for r in started) == ["alice", "bob"] and len({r["run_id"] for r in started}) == 2
