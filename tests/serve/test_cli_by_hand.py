"""`proctor approvals`, `proctor runs` and `proctor audit show` used by hand: whole ids, unique prefixes,
a closed pipe, and timelines with times, reasons, approvers and whole arguments at 60 and 80 columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.cli import PIPE_CLOSED
from proctor.store.base import PendingApproval, RunStore

from .inbox_helpers import POLICY, Inbox

pytestmark = pytest.mark.timeout(300)

APPROVER = "bartholomew.approver-on-call"
WORDS = " ".join(f"w{i:03}" for i in range(90))  # a body far wider than any terminal
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def proctor(*args: str, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PROCTOR_STORE": ""}
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "proctor.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_ids_are_printed_whole_and_taken_by_unique_prefix(inbox: Inbox) -> None:
    approval_id = inbox.suspend()
    store = RunStore.open(inbox.store_url)
    run_id = store.get_approval(approval_id).run_id
    store.close()
    for columns in (None, 60, 80):
        listed = proctor("approvals", "list", "--store", inbox.store_url, columns=columns)
        assert listed.returncode == 0, listed.stderr
        assert approval_id in listed.stdout and run_id in listed.stdout and "…" not in listed.stdout, listed.stdout
        runs = proctor("runs", "list", "--store", inbox.store_url, columns=columns)
        assert run_id in runs.stdout and approval_id in runs.stdout, runs.stdout
    shown = proctor("approvals", "show", approval_id[:8], "--store", inbox.store_url)
    assert shown.returncode == 0 and f"approval {approval_id}" in shown.stdout, shown.stderr
    assert proctor("runs", "show", run_id[:9], "--store", inbox.store_url).returncode == 0
    assert proctor("approvals", "list", "--run", run_id[:7], "--store", inbox.store_url).returncode == 0
    short = proctor("approvals", "show", approval_id[:5], "--store", inbox.store_url)
    assert short.returncode == 1 and "at least 6 characters" in short.stderr
    none = proctor("approvals", "show", "apr_zzzzzzzz", "--store", inbox.store_url)
    assert none.returncode == 1 and "no approval 'apr_zzzzzzzz'" in none.stderr
    approved = proctor("approvals", "approve", approval_id[:10], "--as", "bob", "--store", inbox.store_url,
                       "--audit", str(inbox.tmp / "audit.jsonl"))
    assert approved.returncode == 0 and approval_id in approved.stdout, approved.stderr
    audit = proctor("audit", "show", str(inbox.tmp / "audit.jsonl"), "--run", run_id[:8])
    assert audit.returncode == 0 and run_id in audit.stdout, audit.stderr


def test_an_ambiguous_prefix_is_refused_naming_the_candidates(inbox: Inbox) -> None:
    store = RunStore.open(inbox.store_url)
    try:
        for n in (1, 2):
            store.file_approval(PendingApproval(id=f"apr_twin00{n}", run_id="run_x", call_id=f"c{n}", tool="send",
                                                binding=f"{n}" * 64, policy_sha256="0" * 64))
    finally:
        store.close()
    out = proctor("approvals", "deny", "apr_twin", "--reason", "no", "--as", "bob", "--store", inbox.store_url)
    assert out.returncode == 1 and "ambiguous" in out.stderr
    assert "apr_twin001" in out.stderr and "apr_twin002" in out.stderr
    assert proctor("approvals", "show", "apr_twin002", "--store", inbox.store_url).returncode == 0


@pytest.mark.parametrize("command", [
    ("approvals", "list"), ("approvals", "show", "PREFIX"), ("runs", "list"), ("runs", "show", "RUN"),
    ("policy", "explain", "POLICY", "--tool", "send", "--args", '{"to": "x", "body": "y"}'),
    ("policy", "schema"), ("audit", "show", "LOG"),
])
def test_a_closed_pipe_ends_every_command_quietly(inbox: Inbox, command: tuple[str, ...]) -> None:
    """The reader is gone before the command writes (`| head` that already quit): no traceback, 141."""
    approval_id = inbox.suspend()
    store = RunStore.open(inbox.store_url)
    run_id = store.get_approval(approval_id).run_id
    store.close()
    policy = inbox.tmp / "policy.json"
    policy.write_text(json.dumps(POLICY))
    names = {"PREFIX": approval_id[:8], "RUN": run_id, "POLICY": str(policy), "LOG": str(inbox.tmp / "audit.jsonl")}
    argv = [names.get(a, a) for a in command]
    if command[0] in ("approvals", "runs"):
        argv += ["--store", inbox.store_url]
    read, write = os.pipe()
    os.close(read)  # nobody will ever read: the first write fails with EPIPE
    proc = subprocess.run([sys.executable, "-m", "proctor.cli", *argv], stdout=write, stderr=subprocess.PIPE,
                          text=True, timeout=120, env={**os.environ, "PROCTOR_STORE": ""})
    os.close(write)
    assert proc.returncode == PIPE_CLOSED, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr and proc.stderr == ""


def _answered_run(inbox: Inbox) -> tuple[str, str, Path]:
    """Two suspended runs: one approved with a reason by a long-named approver and resumed, one edited."""
    first = inbox.suspend(task="Send carol her invoice")
    ok = proctor("approvals", "approve", first, "--as", APPROVER, "--reason", "checked the purchase order",
                 "--store", inbox.store_url, "--audit", str(inbox.tmp / "audit.jsonl"))
    assert ok.returncode == 0, ok.stderr
    second = inbox.suspend(task="Send carol a long note")
    edit = proctor("approvals", "edit", second, "--as", APPROVER, "--reason", "the long version",
                   "--args", f'{{"to": "carol@partner.org", "body": "{WORDS}"}}', "--store", inbox.store_url,
                   "--audit", str(inbox.tmp / "audit.jsonl"))
    assert edit.returncode == 0, edit.stderr
    store = RunStore.open(inbox.store_url)
    runs = [store.get_approval(a).run_id for a in (first, second)]
    store.close()
    assert inbox.resume(runs[0]).status == "done"
    return runs[0], runs[1], inbox.tmp / "audit.jsonl"


@pytest.mark.parametrize("columns", [60, 80])
def test_runs_show_prints_times_reasons_and_whole_arguments(inbox: Inbox, columns: int) -> None:
    done, edited, _log = _answered_run(inbox)
    out = proctor("runs", "show", edited, "--store", inbox.store_url, columns=columns)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert max(len(line) for line in text.splitlines()) <= columns
    assert APPROVER in text  # on one line, never cut
    assert "the long version" in text and STAMP.search(text)
    assert all(word in text for word in WORDS.split()), "an argument was cut"
    assert "edited arguments" in text and "original arguments" in text
    out = proctor("runs", "show", done, "--store", inbox.store_url, columns=columns)
    assert APPROVER in out.stdout and "checked the purchase order" in out.stdout
    as_json = proctor("runs", "show", done, "--store", inbox.store_url, "--json")
    data = json.loads(as_json.stdout)
    assert data["approvals"][0]["answer"]["approver"] == APPROVER
    assert data["approvals"][0]["answer"]["reason"] == "checked the purchase order"


@pytest.mark.parametrize("columns", [60, 80])
def test_audit_show_run_prints_times_reasons_and_the_whole_approver(inbox: Inbox, columns: int) -> None:
    done, _edited, log = _answered_run(inbox)
    out = proctor("audit", "show", str(log), "--run", done, columns=columns)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert max(len(line) for line in text.splitlines()) <= columns
    assert APPROVER in text and "checked the purchase order" in text
    assert STAMP.search(text) and "approval_resolved" in text
    table = proctor("audit", "show", str(log), "--run", done, "--table", columns=columns)
    assert table.returncode == 0, table.stderr
    assert "approve by …" not in table.stdout and "bartholomew" in table.stdout  # wrapped in its cell, not cut
