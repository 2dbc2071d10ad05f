"""`proctor serve token`, `proctor approvals … --server`, and a server that resumes answered runs itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proctor.approval.tokens import TokenFile
from proctor.audit.log import AuditLog
from proctor.serve.app import create_app
from proctor.serve.resumer import Resumer, ready_runs
from proctor.store.base import RunStore

from .browser import serving
from .inbox_helpers import SENT, Inbox


def proctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proctor.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_serve_token_prints_a_token_the_file_only_hashes(tmp_path: Path) -> None:
    """`proctor serve token NAME` prints the token as its last word; the file keeps only its hash."""
    out = proctor("serve", "token", "dana", "--tokens", str(tmp_path / "t.txt"))
    assert out.returncode == 0, out.stderr
    token = out.stdout.split()[-1]
    assert TokenFile.load(tmp_path / "t.txt").who(token) == "dana"
    assert token not in (tmp_path / "t.txt").read_text()
    bad = proctor("serve", "token", "no spaces please", "--tokens", str(tmp_path / "t.txt"))
    assert bad.returncode == 2 and "approver name" in bad.stderr


def test_serve_without_a_token_file_is_a_usage_error(tmp_path: Path) -> None:
    """`proctor serve` refuses to start without a store or a token file, in one line."""
    out = proctor("serve", "--store", f"sqlite:///{tmp_path}/r.db")
    assert out.returncode == 2 and "--tokens" in out.stderr


def test_approvals_through_the_server(inbox: Inbox) -> None:
    """`proctor approvals list/show/approve --server` answer through the API, as the token's approver."""
    approval_id = inbox.suspend(principal="alice")
    store = RunStore.open(inbox.store_url)
    try:
        with serving(create_app(store, TokenFile.load(inbox.tokens_path), answers=inbox.answers)) as url:
            env = {"PROCTOR_TOKEN": inbox.tokens["bob"]}
            listed = proctor("approvals", "list", "--server", url, "--json", env=env)
            assert listed.returncode == 0, listed.stderr
            assert [a["id"] for a in json.loads(listed.stdout)] == [approval_id]
            shown = proctor("approvals", "show", approval_id, "--server", url, env=env)
            assert shown.returncode == 0 and "outbound-mail" in shown.stdout
            own = proctor("approvals", "approve", approval_id, "--server", url,
                          env={"PROCTOR_TOKEN": inbox.tokens["alice"]})
            assert own.returncode == 1 and "four eyes" in own.stderr
            wrong = proctor("approvals", "list", "--server", url, env={"PROCTOR_TOKEN": "nope"})
            assert wrong.returncode == 1 and "401" in wrong.stderr
            ok = proctor("approvals", "approve", approval_id, "--server", url, "--reason", "fine", env=env)
            assert ok.returncode == 0, ok.stderr
        answer = store.get_approval(approval_id).answer
        assert answer is not None and answer.approver == "bob" and answer.address == "127.0.0.1"
    finally:
        store.close()


def test_resumer_takes_up_answered_runs(inbox: Inbox) -> None:
    """A server started with --resume resumes a suspended run once its approval is answered; the call runs once."""
    approval_id = inbox.suspend()
    store = RunStore.open(inbox.store_url)
    try:
        resumer = Resumer(store, lambda: inbox.agent(store, responses=["```python\nfinal_answer('x')\n```"]),
                          interval_s=0.2)
        resumer.start()
        try:
            time.sleep(0.5)
            assert ready_runs(store) == [] and resumer.resumed == []  # nothing answered yet: nothing resumed
            current = store.get_approval(approval_id)
            from proctor.approval.answers import answer

            answer(store, approval_id, approver="bob", address="test", decision="approve", binding=current.binding,
                   seal=inbox.answers)
            deadline = time.monotonic() + 120
            while not resumer.resumed and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            resumer.stop()
        assert resumer.resumed == [(current.run_id, "done")]
        assert SENT == [("carol@partner.org", "your invoice")]
        assert store.get_run(current.run_id).status == "done"
    finally:
        store.close()


def test_serve_halting_needs_an_audit_log_and_serves_the_store_halts(inbox: Inbox, tmp_path: Path) -> None:
    """`--halt-groups` without an audit log is refused; with one, the server shows and sets the store's halts."""
    from proctor.approval.tokens import add_token

    env = {k: v for k, v in os.environ.items() if k != "PROCTOR_AUDIT"}
    base = ["serve", "--store", inbox.store_url, "--tokens", str(inbox.tokens_path), "--halt-groups", "sre"]
    out = subprocess.run([sys.executable, "-m", "proctor.cli", *base], capture_output=True, text=True, timeout=120,
                         env=env)
    assert out.returncode == 2 and "--audit" in out.stderr
    inbox.suspend()
    store = RunStore.open(inbox.store_url)
    run_id = store.list_runs()[0].run_id
    store.close()
    erin = add_token(inbox.tokens_path, "erin", ("sre",))
    from .browser import free_port

    port = free_port()
    audit = tmp_path / "serve-audit.jsonl"
    with subprocess.Popen([sys.executable, "-m", "proctor.cli", *base, "--audit", str(audit), "--port", str(port)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env) as server:
        _halt_through(server, port, erin, run_id, inbox)
    assert "halt_set" in audit.read_text()


def _halt_through(server: subprocess.Popen[str], port: int, token: str, run_id: str, inbox: Inbox) -> None:
    import httpx

    try:
        url, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + 60
        while True:
            try:
                assert httpx.get(f"{url}/api/halts", headers=headers).json() == {"halts": []}
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and server.poll() is None, server.stderr
                time.sleep(0.2)
        made = httpx.post(f"{url}/api/runs/{run_id}/halt", json={"reason": "from the CLI's server"}, headers=headers)
        assert made.status_code == 200, made.text
        listed = proctor("halt", "--list", "--json", "--store", inbox.store_url)
        assert [h["id"] for h in json.loads(listed.stdout)] == [made.json()["halt"]["id"]]
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.server  # (and `proctor runs`, which the tier guard counts as one that may start an agent's worker)
@pytest.mark.sandbox
def test_commands_that_read_runs_refuse_a_store_that_does_not_exist_instead_of_creating_it(tmp_path: Path) -> None:
    """A mistyped SQLite path made a new, empty store: `runs list` showed nothing and `approvals list` no approval.
    Now they say there is no store there (and create nothing); the inbox, which may start before any agent, creates
    it and says so."""
    typo = tmp_path / "rnus.db"
    for args in (["runs", "list"], ["approvals", "list"], ["runs", "show", "run_x"]):
        out = proctor(*args, "--store", f"sqlite:///{typo}")
        assert out.returncode != 0 and f"no run store at {typo}: an agent run with --store creates it" in out.stderr, \
            (args, out.stderr)
    log = tmp_path / "audit.jsonl"
    AuditLog(log).close()  # a trail, and its secret beside it
    verified = proctor("audit", "verify", str(log), "--store", f"sqlite:///{typo}")
    assert verified.returncode != 0 and f"no run store at {typo}" in verified.stderr, verified.stderr
    assert not typo.exists()
    tokens = tmp_path / "tokens.txt"
    assert proctor("serve", "token", "bob", "--tokens", str(tokens)).returncode == 0
    server = subprocess.Popen([sys.executable, "-m", "proctor.cli", "serve", "--store", f"sqlite:///{typo}", "--tokens",
                               str(tokens), "--audit", str(log), "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        first = server.stderr.readline()
    finally:
        server.terminate()
        server.wait(10)
        if server.stderr is not None:
            server.stderr.close()
    assert first.startswith(f"proctor serve: no run store at {typo} yet: created it empty; the agents' --store must "
                            "name the same file"), first
    assert typo.exists()


def test_serve_refuses_a_max_body_the_request_guard_cannot_take_before_it_starts(tmp_path: Path) -> None:
    """Below the login form's 8 KiB the guard refuses to be built: the server used to start and answer its first
    request with an error. The value is checked as it is parsed, as `proctor mcp serve --max-body` checks it."""
    tokens = tmp_path / "tokens.txt"
    assert proctor("serve", "token", "bob", "--tokens", str(tokens)).returncode == 0
    for value, said in (("100", "100: give at least 8192 bytes"), ("lots", "'lots' is not a whole number of bytes")):
        out = proctor("serve", "--store", f"sqlite:///{tmp_path}/r.db", "--tokens", str(tokens), "--max-body", value)
        assert out.returncode == 2 and f"argument --max-body: {said}" in out.stderr, out.stderr
    assert not (tmp_path / "r.db").exists()
