"""Answers the CLI (`--store`) and the inbox refuse are facts in the run's audit trail (`approval_refused`):
who tried, how they were proven, from where, what they tried and why it was refused; the trail still
verifies. Real runs suspended by real workers, the real CLI, `proctor serve` over raw HTTP."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from proctor.approval.tokens import add_token
from proctor.policy.approvers import os_account

from . import inbox_helpers
from .browser import free_port
from .inbox_helpers import TWO_CALLS, Inbox, suspend_program

pytestmark = [pytest.mark.timeout(300), pytest.mark.server]

ME = os_account()


def refusal_policy(timeout: str = "10m") -> dict[str, Any]:
    """Outbound mail needs a member of sre-leads who is not the run's principal; this OS account may answer
    as carol or dave, members of sre-leads."""
    policy = json.loads(json.dumps(inbox_helpers.POSITION_POLICY))
    for rule in policy["rules"]:
        if rule["name"] == "outbound-mail":
            rule["approvers"] = {"groups": ["sre-leads"], "not": "principal"}
    policy["approval"] = {"timeout": timeout, "os_users": {ME: {"as": ["carol", "dave"], "groups": ["sre-leads"]}}}
    return policy


def proctor(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PROCTOR_AUDIT", "PROCTOR_STORE", "PROCTOR_SERVER")}
    return subprocess.run([sys.executable, "-m", "proctor.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def refusals(log: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == "approval_refused"]


def test_refusals_through_the_store_cli_are_audited(inbox: Inbox) -> None:
    log = inbox.tmp / "audit.jsonl"  # the trail the runs write (suspend_program's agents)
    alices = suspend_program(inbox, TWO_CALLS, principal="alice", policy=refusal_policy())
    carols = suspend_program(inbox, TWO_CALLS, principal="carol", policy=refusal_policy())
    expiring = suspend_program(inbox, TWO_CALLS, principal="alice", policy=refusal_policy(timeout="1s"))

    unmapped = proctor("approvals", "approve", alices, "--store", inbox.store_url, "--as", "mallory",
                       "--audit", str(log))
    assert unmapped.returncode == 1 and "may not answer as 'mallory'" in unmapped.stderr
    own = proctor("approvals", "deny", carols, "--store", inbox.store_url, "--as", "carol", "--reason", "mine",
                  "--audit", str(log))
    assert own.returncode == 1 and "principal" in own.stderr and "four eyes" in own.stderr
    time.sleep(1.5)
    late = proctor("approvals", "approve", expiring, "--store", inbox.store_url, "--as", "dave",
                   "--reason", "looked fine", "--audit", str(log))
    assert late.returncode == 1 and "expired" in late.stderr
    assert "not in the audit trail" not in unmapped.stderr + own.stderr + late.stderr

    found = refusals(log)
    assert [(r["approval_id"], r["code"]) for r in found] == [
        (alices, "identity"), (carols, "four_eyes"), (expiring, "not_pending")]
    by_code = {r["code"]: r for r in found}
    assert by_code["identity"]["approver"] == "mallory" and by_code["identity"]["os_user"] == ME
    assert by_code["four_eyes"]["approver"] == "carol" and by_code["four_eyes"]["decision"] == "deny"
    assert by_code["four_eyes"]["answer_reason"] == "mine" and by_code["four_eyes"]["method"] == "os-user"
    assert by_code["not_pending"]["approval_status"] == "expired" and by_code["not_pending"]["tool"] == "send"
    assert all(r["address"].startswith("cli:") and r["run_id"] and r["call_id"] for r in found)
    assert all(r["reason"] and r["reason"] in (unmapped.stderr + own.stderr + late.stderr) for r in found)

    verified = proctor("audit", "verify", str(log))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    timeline = proctor("audit", "show", str(log), "--run", by_code["identity"]["run_id"])
    assert timeline.returncode == 0, timeline.stderr
    assert "approve by mallory (os-user)" in timeline.stdout and "refused (identity)" in timeline.stdout


@pytest.mark.parametrize("halting", [False, True], ids=["trail-per-refusal", "trail-held-for-halts"])
def test_refusals_by_the_inbox_over_http_are_audited(inbox: Inbox, halting: bool) -> None:
    """Over raw HTTP to `proctor serve --audit LOG`; with `--halt-groups` the inbox holds the log open for
    its halts (one writer per file log), and its refusals go through that same sink."""
    log = inbox.tmp / "audit.jsonl"
    approval_id = suspend_program(inbox, TWO_CALLS, principal="alice", policy=refusal_policy())
    tokens = inbox.tmp / "groups.txt"
    token = {"bob": add_token(tokens, "bob", ("sre-leads",)), "mallory": add_token(tokens, "mallory"),
             "alice": add_token(tokens, "alice", ("sre-leads",))}
    port = free_port()
    errors = (inbox.tmp / "serve.err").open("w")
    server = subprocess.Popen([sys.executable, "-m", "proctor.cli", "serve", "--store", inbox.store_url, "--tokens",
                               str(tokens), "--port", str(port), "--audit", str(log),
                               *(["--halt-groups", "sre-leads"] if halting else [])],
                              stdout=subprocess.PIPE, stderr=errors, text=True)
    try:
        assert server.stdout is not None
        assert "proctor inbox on" in server.stdout.readline()  # printed as uvicorn starts: wait for it to listen
        deadline = time.monotonic() + 60
        while True:
            probe = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            try:
                probe.connect()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the inbox did not start listening"
                time.sleep(0.1)
            finally:
                probe.close()

        def post(who: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", f"/api/approvals/{approval_id}", json.dumps(body),
                         {"Authorization": f"Bearer {token[who]}", "Content-Type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read())
            conn.close()
            return response.status, data

        binding = json.loads(subprocess.run(
            [sys.executable, "-m", "proctor.cli", "approvals", "show", approval_id, "--store", inbox.store_url,
             "--json"], capture_output=True, text=True, timeout=120).stdout)["binding"]
        assert post("mallory", {"decision": "approve", "binding": binding})[0] == 403
        assert post("alice", {"decision": "approve", "binding": binding, "reason": "trust me"})[0] == 403
        status, forged = post("bob", {"decision": "approve", "binding": "f" * 64})
        assert status == 409 and "binding mismatch" in forged["error"]
        assert post("bob", {"decision": "deny", "binding": binding})[0] == 422  # a deny without a reason
        assert post("bob", {"decision": "approve", "binding": binding, "reason": "checked"})[0] == 200
    finally:
        server.terminate()
        server.wait(timeout=60)
        assert server.stdout is not None
        server.stdout.close()
        errors.close()

    found = refusals(log)
    assert [(r["approver"], r["code"]) for r in found] == [
        ("mallory", "not_admitted"), ("alice", "four_eyes"), ("bob", "binding"), ("bob", "invalid")]
    assert all(r["method"] == "token" and r["address"] == "127.0.0.1" and r["approval_id"] == approval_id
               for r in found)
    assert found[0]["groups"] == [] and "sre-leads" in found[0]["reason"]
    assert found[1]["answer_reason"] == "trust me"
    assert found[2]["answered_binding"] == "f" * 64 and found[2]["binding"] == binding
    verified = proctor("audit", "verify", str(log))
    assert verified.returncode == 0, verified.stdout + verified.stderr
