"""`proctor mcp serve --http` with bearer tokens, driven by the mcp SDK's own client."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import mcp.types as mt
import pytest

from codemode.helpers import (
    INITIALIZE,
    INITIALIZED,
    audit_records,
    free_port,
    http_server,
    http_session,
    serve_args,
    text,
    write_config,
)
from proctor.approval.tokens import add_token


@pytest.fixture
def served(tmp_path: Path) -> Any:
    servers, policy, audit = write_config(tmp_path)
    tokens = tmp_path / "tokens.txt"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    port = free_port()
    args = serve_args(servers, policy, audit, "--http", f"127.0.0.1:{port}", "--tokens", str(tokens))
    with http_server(args, port):
        yield f"http://127.0.0.1:{port}/mcp", {"alice": alice, "bob": bob}, audit


@contextmanager
def serving(tmp_path: Path, user: str, *extra: str) -> Iterator[tuple[str, str, Path]]:
    """`proctor mcp serve --http` with one token, `user`'s, and the `extra` flags: (its URL, the token, the audit
    trail), while it runs."""
    servers, policy, audit = write_config(tmp_path)
    tokens = tmp_path / "tokens.txt"
    token = add_token(tokens, user)
    port = free_port()
    with http_server(serve_args(servers, policy, audit, "--http", f"127.0.0.1:{port}", "--tokens", str(tokens),
                                *extra), port):
        yield f"http://127.0.0.1:{port}/mcp", token, audit


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


def test_a_session_is_its_openers_from_its_initialize_not_from_its_first_program(served: Any) -> None:
    """Another token with the session's id gets 403 before any program ran there too: it can neither take
    the session over (its run would be the other principal's, and the opener locked out) nor end it."""
    url, tokens, audit = served
    sid = _open(url, tokens["alice"])
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": "t_add(1, 2)"}}}
    assert _post(url, tokens["bob"], call, sid).status_code == 403
    ending = httpx.delete(url, headers={"Authorization": f"Bearer {tokens['bob']}", "mcp-session-id": sid,
                                        "MCP-Protocol-Version": "2025-06-18"}, timeout=60)
    assert ending.status_code == 403
    # Nor with its id twice over, its own session's id second: the ownership check and the SDK would read
    # different copies (the SDK routes by the first).
    bobs = _post(url, tokens["bob"], INITIALIZE).headers["mcp-session-id"]
    twice = [("Authorization", f"Bearer {tokens['bob']}"), ("MCP-Protocol-Version", "2025-06-18"),
             ("mcp-session-id", sid), ("mcp-session-id", bobs)]
    assert httpx.delete(url, headers=twice, timeout=60).status_code == 400
    mine = _post(url, tokens["alice"], {**call, "id": 3}, sid)
    assert mine.status_code == 200 and "value: 3" in mine.text
    started = [r for r in audit_records(audit) if r["kind"] == "run_started"]
    assert [r["principal"] for r in started] == ["alice"]


def _post(url: str, token: str, body: dict[str, Any], sid: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-06-18"}
    if sid is not None:
        headers["mcp-session-id"] = sid
    return httpx.post(url, json=body, headers=headers, timeout=60)


def _vanishing_client(url: str, token: str, code: str) -> tuple[str, str]:
    """A client that opens a session, runs one program and goes away without deleting its session."""
    sid = _open(url, token)
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": code}}}
    answer = _post(url, token, call, sid)
    assert answer.status_code == 200, answer.text
    return sid, answer.text


def test_a_client_that_vanishes_has_its_run_ended_after_the_idle_time(tmp_path: Path) -> None:
    with serving(tmp_path, "carol", "--session-idle", "1s") as (url, carol, audit):
        sid, out = _vanishing_client(url, carol, "t_add(20, 22)")
        assert "value: 42" in out
        _wait_for_finish(audit)
        # The same session id later: told it has ended (or, once the SDK forgot it, 404), never a new run.
        late = {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                "params": {"name": "run_python", "arguments": {"code": "1"}}}
        again = _post(url, carol, late, sid)
        assert again.status_code == 404 or "this MCP session was ended after 1s without a request" in again.text
    records = audit_records(audit)
    started = [r for r in records if r["kind"] == "run_started"]
    finished = [r for r in records if r["kind"] == "run_finished"]
    assert len(started) == 1 and [f["run_id"] for f in finished] == [started[0]["run_id"]]
    assert finished[0]["status"] == "abandoned" and "went away" in finished[0]["reason"]
    assert finished[0]["calls"]["ok"] == 1


def test_a_session_running_a_program_is_not_reaped_however_long_it_runs(tmp_path: Path) -> None:
    with serving(tmp_path, "dave", "--session-idle", "1s", "--import", "time") as (url, dave, audit):
        _, out = _vanishing_client(url, dave, "import time\ntime.sleep(2.5)\nt_add(1, 2)")
        assert "value: 3" in out and "error" not in out  # not ended while its program ran
        finished = _wait_for_finish(audit)
    assert [f["status"] for f in finished] == ["abandoned"] and finished[0]["calls"]["ok"] == 1


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_server_stopped_by_a_signal_ends_its_sessions_runs_as_interrupted(tmp_path: Path, signum: int) -> None:
    """SIGTERM and SIGHUP (docs/code-mode.md: the server stops) finish every session's run before the exit."""
    servers, policy, audit = write_config(tmp_path)
    tokens = tmp_path / "tokens.txt"
    erin = add_token(tokens, "erin")
    port = free_port()
    args = serve_args(servers, policy, audit, "--http", f"127.0.0.1:{port}", "--tokens", str(tokens))
    with http_server(args, port) as proc:
        _vanishing_client(f"http://127.0.0.1:{port}/mcp", erin, "t_add(1, 1)")
        proc.send_signal(signum)
        assert proc.wait(60) == 128 + signum  # the exit a signalled process has, after the records
    finished = [r for r in audit_records(audit) if r["kind"] == "run_finished"]
    name = signal.Signals(signum).name
    assert [(f["status"], f["error"], f["calls"]["ok"]) for f in finished] == [
        ("interrupted", f"interrupted by {name}", 1)]


def _wait_for_finish(audit: Path) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        finished = [r for r in audit_records(audit) if r["kind"] == "run_finished"]
        if finished:
            return finished
        time.sleep(0.1)
    raise AssertionError("no run_finished within 30s")


def test_session_idle_must_be_a_duration(tmp_path: Path) -> None:
    servers, policy, audit = write_config(tmp_path)
    done = subprocess.run([sys.executable, *serve_args(servers, policy, audit, "--http", "127.0.0.1:1",
                                                       "--tokens", str(tmp_path / "t"), "--session-idle", "5")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--session-idle '5': bad duration '5' (write a number and a unit" in done.stderr


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_max_sessions_per_principal_is_a_positive_whole_number_or_off(tmp_path: Path, value: str) -> None:
    servers, policy, audit = write_config(tmp_path)
    done = subprocess.run([sys.executable, *serve_args(servers, policy, audit, "--http", "127.0.0.1:1", "--tokens",
                                                       str(tmp_path / "t"), "--max-sessions-per-principal", value)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"--max-sessions-per-principal {value!r}: a whole number of sessions, at least 1, or 'off'" in done.stderr


def test_a_delete_the_sdk_refuses_ends_no_run_and_the_session_stays_its_openers(served: Any) -> None:
    """The run ends only when the session does: a DELETE the SDK refuses (here: a protocol version it does not
    speak) must not finish the run and drop the opener's claim while the SDK keeps serving the session, or
    another token could take the live session over (its own run there) and lock the opener out."""
    url, tokens, audit = served
    sid = _open(url, tokens["alice"])
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "run_python", "arguments": {"code": "kept = t_add(1, 2)\nkept"}}}
    assert "value: 3" in _post(url, tokens["alice"], call, sid).text
    refused = httpx.delete(url, headers={"Authorization": f"Bearer {tokens['alice']}", "mcp-session-id": sid,
                                         "MCP-Protocol-Version": "1999-01-01"}, timeout=60)
    assert refused.status_code >= 400
    again = {**call, "id": 3, "params": {"name": "run_python", "arguments": {"code": "kept"}}}
    assert _post(url, tokens["bob"], again, sid).status_code == 403
    mine = _post(url, tokens["alice"], again, sid)
    assert mine.status_code == 200 and "value: 3" in mine.text  # the same run, its namespace kept
    records = audit_records(audit)
    assert [r["principal"] for r in records if r["kind"] == "run_started"] == ["alice"]
    assert [r for r in records if r["kind"] == "run_finished"] == []


def test_a_session_holding_its_event_stream_open_is_not_idle_and_stays_its_openers(tmp_path: Path) -> None:
    """The SDK keeps a session whose client holds its GET event stream open (the SDK's own client does),
    however long: proctor must not forget who opened it meanwhile, or another token with its id would get
    past the 403 and start its own run in the opener's live session."""
    import threading

    servers, policy, audit = write_config(tmp_path)
    tokens = tmp_path / "tokens.txt"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    port = free_port()
    args = serve_args(servers, policy, audit, "--http", f"127.0.0.1:{port}", "--tokens", str(tokens),
                      "--session-idle", "1s")
    url = f"http://127.0.0.1:{port}/mcp"
    with http_server(args, port):
        sid = _open(url, alice)
        listening = threading.Event()

        def listen() -> None:
            headers = {"Authorization": f"Bearer {alice}", "mcp-session-id": sid, "Accept": "text/event-stream",
                       "MCP-Protocol-Version": "2025-06-18"}
            try:
                with httpx.stream("GET", url, headers=headers, timeout=None) as stream:
                    assert stream.status_code == 200
                    listening.set()
                    for _ in stream.iter_raw():
                        pass
            except httpx.HTTPError:  # the server stops at the end of the test
                pass

        threading.Thread(target=listen, daemon=True).start()
        assert listening.wait(30)
        time.sleep(3)  # three idle periods without a POST, the event stream open throughout
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "run_python", "arguments": {"code": "t_add(1, 1)"}}}
        assert _post(url, bob, call, sid).status_code == 403
        mine = _post(url, alice, {**call, "id": 3}, sid)
        assert mine.status_code == 200 and "value: 2" in mine.text
    assert [r["principal"] for r in audit_records(audit) if r["kind"] == "run_started"] == ["alice"]


def _open(url: str, token: str) -> str:
    """A session opened by `token`'s client (initialize, then initialized): its id."""
    opened = _post(url, token, INITIALIZE)
    assert opened.status_code == 200, opened.text
    sid = opened.headers["mcp-session-id"]
    assert _post(url, token, INITIALIZED, sid).status_code == 202
    return sid


def test_two_programs_sent_at_once_in_one_session_are_both_asked_about_through_elicitation(served: Any) -> None:
    """A client may send its next run_python before the last one answered: the programs run one after the other
    in the session's namespace, and each one's approval reaches the client's user, never 'the MCP client does not
    support elicitation' for the second (it does; the first request's end had cleared its channel)."""
    url, tokens, audit = served
    asked: list[str] = []

    async def approve(context: Any, params: Any) -> Any:
        asked.append(params.model_dump(by_alias=True).get("message", ""))
        await asyncio.sleep(0.5)
        return mt.ElicitResult(action="accept", content={"approve": True, "reason": "fine"})

    async def go() -> list[str]:
        async with http_session(url, tokens["alice"], approve) as s:
            both = await asyncio.gather(s.call_tool("run_python", {"code": "t_delete_file('/tmp/one')"}),
                                        s.call_tool("run_python", {"code": "t_delete_file('/tmp/two')"}))
            return [text(r) for r in both]

    outs = asyncio.run(go())
    assert sorted("deleted /tmp/one" in o for o in outs) == [False, True]
    assert sorted("deleted /tmp/two" in o for o in outs) == [False, True]
    assert len(asked) == 2 and "not support elicitation" not in "".join(outs)
    approvals = [r for r in audit_records(audit) if r["kind"] == "approval_resolved"]
    assert [(a["verdict"], a["approver"]) for a in approvals] == [("approve", "mcp-elicitation:alice")] * 2


@pytest.mark.parametrize(("bind", "served_by_name"), [("0.0.0.0", True), ("127.0.0.1", False)])
def test_a_server_bound_beyond_localhost_answers_clients_that_name_it(tmp_path: Path, bind: str,
                                                                       served_by_name: bool) -> None:
    """`--http 0.0.0.0:PORT` is how docs/code-mode.md serves remote clients, which send `Host: theserver:PORT`:
    they must be served (the bearer token is the check), not refused as a DNS rebinding (421) by the SDK's
    localhost-only host check. Bound to 127.0.0.1, that check stays: a page that renamed itself to 127.0.0.1
    gets nothing."""
    servers, policy, audit = write_config(tmp_path)
    tokens = tmp_path / "tokens.txt"
    alice = add_token(tokens, "alice")
    port = free_port()
    args = serve_args(servers, policy, audit, "--http", f"{bind}:{port}", "--tokens", str(tokens))
    headers = {"Authorization": f"Bearer {alice}", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-06-18", "Host": f"proctor.internal:{port}"}
    with http_server(args, port):
        answer = httpx.post(f"http://127.0.0.1:{port}/mcp", json=INITIALIZE, headers=headers, timeout=60)
    if served_by_name:
        assert answer.status_code == 200 and "mcp-session-id" in answer.headers, answer.text
    else:
        assert answer.status_code == 421


def test_a_port_another_server_holds_is_said_in_one_line_before_any_upstream_starts(tmp_path: Path) -> None:
    """It printed "serving on http://…/mcp", then uvicorn's bind error, and exited 3 after starting every upstream."""
    import socket

    servers, policy, audit = write_config(tmp_path)
    tokens = tmp_path / "tokens.txt"
    add_token(tokens, "alice")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = subprocess.run([sys.executable, *serve_args(servers, policy, audit, "--http", f"127.0.0.1:{port}",
                                                          "--tokens", str(tokens))],
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--http 127.0.0.1:{port}: cannot listen there:" in lines[0], done.stderr
    assert "another server holds that port" in lines[0]
    assert not (tmp_path / "upstream.log").exists()  # the upstream was never started


def test_a_principal_holds_at_most_max_sessions_per_principal_open_and_an_ended_one_frees_its_place(
        tmp_path: Path) -> None:
    """`--max-sessions-per-principal 2`: alice's third initialize is refused (429, and a JSON-RPC error whose one
    line says why and what to do, which the SDK's client raises from initialize) while bob still opens his; a
    session she ends (DELETE) or that is ended for idleness gives its place back."""
    from proctor.integrations.mcp import MCP_MAJOR, SDKError  # the mcp SDK's error (1.x spells it McpError)

    servers, policy, audit = write_config(tmp_path)
    tokens = tmp_path / "tokens.txt"
    alice, bob = add_token(tokens, "alice"), add_token(tokens, "bob")
    port = free_port()
    args = serve_args(servers, policy, audit, "--http", f"127.0.0.1:{port}", "--tokens", str(tokens),
                      "--max-sessions-per-principal", "2", "--session-idle", "2s")
    url = f"http://127.0.0.1:{port}/mcp"
    with http_server(args, port):
        first, second = _open(url, alice), _open(url, alice)
        refused = _post(url, alice, INITIALIZE)
        assert refused.status_code == 429
        said = refused.json()["error"]["message"]
        assert said == ("alice already has 2 open MCP sessions, the most --max-sessions-per-principal allows (2): end "
                        "one (its client closes it, or DELETE /mcp with its Mcp-Session-Id), or an idle one is ended "
                        "after --session-idle (2s without a request)")

        async def sdk_client() -> str:
            try:
                async with http_session(url, alice):
                    return "opened"
            except Exception as exc:  # the SDK raises the server's JSON-RPC error from initialize (in a group, maybe)
                errors = [exc, *getattr(exc, "exceptions", [])]
                return next((str(e) for e in errors if isinstance(e, SDKError)), repr(exc))

        # mcp 2.x's client raises the JSON-RPC error in the body; 1.x's raises the status alone
        assert ("alice already has 2 open MCP sessions" if MCP_MAJOR >= 2 else "429 Too Many Requests") in \
            asyncio.run(sdk_client())
        _open(url, bob)  # another principal is not held back by alice's sessions
        ended = httpx.delete(url, headers={"Authorization": f"Bearer {alice}", "mcp-session-id": first,
                                           "MCP-Protocol-Version": "2025-06-18"}, timeout=60)
        assert ended.status_code == 200
        third = _open(url, alice)  # the place the DELETE freed
        assert _post(url, alice, INITIALIZE).status_code == 429
        deadline = time.monotonic() + 30
        while _post(url, alice, INITIALIZE).status_code == 429:  # second and third idle: reaped, their places free
            assert time.monotonic() < deadline, "no place freed by the idle sessions' end"
            time.sleep(0.5)
        assert second != third


def test_a_request_body_past_max_body_is_refused_before_it_is_read_and_the_server_goes_on(tmp_path: Path) -> None:
    """Even a token's holder cannot make the server keep a body of any size (the MCP SDK reads a request's body whole
    before it parses it): past --max-body, 413 at once when declared, or as soon as a chunked one passes it; only
    JSON is taken; the server serves the next request."""
    big = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"name": "run_python", "arguments": {"code": "x = 1\n" * 20_000}}}

    def chunks() -> Any:
        data = json.dumps(big).encode()
        for i in range(0, len(data), 4096):
            yield data[i:i + 4096]

    with serving(tmp_path, "alice", "--max-body", "65536") as (url, alice, _):
        headers = {"Authorization": f"Bearer {alice}", "Accept": "application/json, text/event-stream",
                   "Content-Type": "application/json"}
        declared = httpx.post(url, json=big, headers=headers, timeout=30)
        assert declared.status_code == 413 and "over the 65536-byte limit" in declared.text, declared.text
        streamed = httpx.post(url, content=chunks(), headers=headers, timeout=30)
        assert streamed.status_code == 413 and "over the 65536-byte limit" in streamed.text, streamed.text
        form = httpx.post(url, content=b"code=1", headers={**headers, "Content-Type": "text/plain"}, timeout=30)
        assert form.status_code == 415, form.text
        sid = _open(url, alice)  # and the server goes on
        ran = _post(url, alice, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                 "params": {"name": "run_python", "arguments": {"code": "1 + 2"}}}, sid)
        assert ran.status_code == 200 and "value: 3" in ran.text, ran.text


@pytest.mark.parametrize(("flag", "message"), [(["--max-body", "100"], "give at least 8192 bytes"),
                                               (["--max-body", "9000", "--user", "u"], "--max-body is for --http")])
def test_max_body_is_checked_before_anything_starts(tmp_path: Path, flag: list[str], message: str) -> None:
    servers, policy, audit = write_config(tmp_path)
    tokens = tmp_path / "tokens.txt"
    add_token(tokens, "alice")
    extra = ["--http", f"127.0.0.1:{free_port()}", "--tokens", str(tokens)] if "--user" not in flag else []
    out = subprocess.run([sys.executable, *serve_args(servers, policy, audit, *extra, *flag)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and message in out.stderr, out.stderr
