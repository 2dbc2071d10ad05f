"""`proctor mcp serve` over stdio, driven by the mcp SDK's own client (with an elicitation callback)."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp.types as mt

from codemode.helpers import POLICY, audit_records, raw_run_python, serve_args, stdio_session, text, write_config

POLICY_30S = POLICY.replace("timeout: 3s", "timeout: 30s")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_client_sees_three_tools_and_reads_definitions_on_demand(tmp_path: Path) -> None:
    servers, policy, audit = write_config(tmp_path)

    async def go() -> tuple[list[str], str, str, str]:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice")) as s:
            listed = await s.list_tools()
            names = sorted(t.name for t in listed.tools)
            found = text(await s.call_tool("search_tools", {"query": "weather"}))
            ship = text(await s.call_tool("describe_tool", {"name": "t_ship"}))
            missing = text(await s.call_tool("describe_tool", {"name": "ship"}))
            return names, found, ship, missing

    names, found, ship, missing = run(go())
    assert names == ["describe_tool", "run_python", "search_tools"]
    assert found.splitlines()[0] == ("t_get_weather(city: str, units: str = 'metric') -> str"
                                     "  # Tell the weather in a city.")
    assert "def t_ship(to: Address, count: int, note: str | None = None, express: bool = False) -> dict[str, str]:" \
        in ship
    assert "class Address(TypedDict):" in ship and "side effect: destructive" in ship and "# from mcp:t" in ship
    assert "no tool named 'ship'; did you mean t_ship?" in missing


def test_one_session_is_one_run_namespace_and_budget_span_its_programs(tmp_path: Path) -> None:
    """A per-run budget of 10 calls holds across three run_python calls; variables persist."""
    servers, policy, audit = write_config(tmp_path)

    async def go() -> list[str]:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice")) as s:
            outs = []
            outs.append(text(await s.call_tool("run_python", {"code": "xs = [t_add(i, 1) for i in range(4)]\nxs"})))
            outs.append(text(await s.call_tool("run_python", {"code": "ys = [t_add(x, x) for x in xs]\nsum(ys)"})))
            outs.append(text(await s.call_tool("run_python", {"code": (
                "got = []\nfor i in range(4):\n    try:\n        got.append(t_add(i, 0))\n"
                "    except BudgetExceeded as e:\n        got.append('refused')\ngot")})))
            return outs

    first, second, third = run(go())
    assert "value: [1, 2, 3, 4]" in first
    assert "t_add" in first and "allow" in first and "ok" in first
    assert "value: 20" in second
    assert "value: [0, 1, 'refused', 'refused']" in third
    assert "budget" in third.lower()
    records = audit_records(audit)
    runs = {r["run_id"] for r in records if r["kind"] == "call_intent"}
    assert len(runs) == 1
    started = [r for r in records if r["kind"] == "run_started"]
    assert [r["principal"] for r in started] == ["alice"]
    finished = [r for r in records if r["kind"] == "run_finished"]
    assert len(finished) == 1 and finished[0]["run_id"] in runs and finished[0]["status"] == "done"


def _answering(action: str, approve: bool = True, delay: float = 0.0) -> Any:
    seen: list[str] = []

    async def elicit(context: Any, params: Any) -> Any:
        seen.append(params.model_dump(by_alias=True).get("message", ""))
        if delay:
            await asyncio.sleep(delay)
        if action != "accept":
            return mt.ElicitResult(action=action)  # type: ignore[arg-type]
        return mt.ElicitResult(action="accept", content={"approve": approve, "reason": "checked by test"})

    elicit.seen = seen  # type: ignore[attr-defined]
    return elicit


def _delete(tmp_path: Path, elicit: Any) -> str:
    servers, policy, audit = write_config(tmp_path)

    async def go() -> str:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice"), elicit) as s:
            code = "n = 1\nr = t_delete_file('/tmp/x\\x1b[31m')\nr"
            return text(await s.call_tool("run_python", {"code": code}))

    return run(go())


def test_an_approval_is_asked_through_elicitation_and_approved(tmp_path: Path) -> None:
    elicit = _answering("accept", approve=True)
    out = _delete(tmp_path, elicit)
    assert "value: 'deleted /tmp/x\\x1b[31m'" in out and "require_approval" in out
    (message,) = elicit.seen
    assert "t_delete_file (destructive)" in message
    assert "\x1b" not in message and "\\x1b" in message  # escaped as the console escapes
    assert "program line 2: r = t_delete_file(" in message
    assert "deleting a file needs a human" in message
    approvals = [r for r in audit_records(tmp_path / "audit.jsonl") if r["kind"] == "approval_resolved"]
    assert [(a["verdict"], a["approver"]) for a in approvals] == [("approve", "mcp-elicitation:alice")]


def test_the_prompt_names_the_line_of_the_call_asked_about_not_the_first_naming_the_tool(tmp_path: Path) -> None:
    servers, policy, audit = write_config(tmp_path)
    elicit = _answering("accept", approve=True)

    async def go() -> str:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice"), elicit) as s:
            code = ("def rm(p):\n    return t_delete_file(p)\n"
                    "first = t_delete_file('/tmp/a')\nsecond = [rm(p) for p in ['/tmp/b']]\n(first, second)")
            return text(await s.call_tool("run_python", {"code": code}))

    out = run(go())
    assert "'deleted /tmp/a'" in out and "'deleted /tmp/b'" in out
    first, second = elicit.seen
    assert "program line 3: first = t_delete_file('/tmp/a')" in first
    assert "program line 2: return t_delete_file(p)" in second  # the call inside the helper, not line 3


def test_the_prompt_shows_the_arguments_whole_with_look_alikes_marked_or_the_user_is_not_asked(tmp_path: Path) -> None:
    """A long padding must not push the part that matters out of the question (the user would approve what
    they never saw), and a Cyrillic letter is spelled out as `proctor approvals show` does."""
    servers, policy, audit = write_config(tmp_path)
    elicit = _answering("accept", approve=True)

    async def go() -> tuple[str, str]:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice"), elicit) as s:
            spoof = text(await s.call_tool("run_python", {"code": "t_delete_file('/srv/\u0435tc')"}))
            long = text(await s.call_tool("run_python", {
                "code": "t_delete_file('/tmp/' + 'a' * 25_000 + '/../../etc/passwd')"}))
            return spoof, long

    spoof, long = run(go())
    assert "value: 'deleted /srv/\u0435tc'" in spoof
    (asked,) = elicit.seen  # only the first call was asked about
    assert "/srv/\u0435\u27e8U+0435\u27e9tc" in asked
    assert "error: ApprovalDenied" in long and "too long to show whole in the client" in long
    log = tmp_path / "upstream.log"
    assert (log.read_text().split() if log.exists() else []).count("delete_file") == 1


def test_an_approval_denied_through_elicitation_raises_in_the_program(tmp_path: Path) -> None:
    out = _delete(tmp_path, _answering("accept", approve=False))
    assert "error: ApprovalDenied" in out and "checked by test" in out
    (tmp_path / "decline").mkdir()
    out = _delete(tmp_path / "decline", _answering("decline"))
    assert "error: ApprovalDenied" in out and "decline" in out


def test_an_unanswered_elicitation_times_out_as_the_policy_says(tmp_path: Path) -> None:
    out = _delete(tmp_path, _answering("accept", delay=8))
    assert "error: ApprovalTimeout" in out and "approval timed out: no answer through MCP elicitation within" in out
    approvals = [r for r in audit_records(tmp_path / "audit.jsonl") if r["kind"] == "approval_resolved"]
    assert [(a["verdict"], a["approver"]) for a in approvals] == [("denied", "timeout")]


def test_without_elicitation_or_an_approver_the_call_is_denied_saying_why(tmp_path: Path) -> None:
    out = _delete(tmp_path, None)
    assert "error: ApprovalDenied" in out
    assert "does not support elicitation and proctor mcp serve has no --approver" in out


def test_the_principal_cannot_answer_their_own_call_through_elicitation_under_four_eyes(tmp_path: Path) -> None:
    """The client's user is the session's principal: `not: principal` (or groups) refuses them, so they are
    never asked, and without an --approver the call is denied saying why (it must not run on their word)."""
    four_eyes = POLICY.replace("    reason: deleting a file needs a human\n",
                               "    reason: deleting a file needs a human\n    approvers: {not: principal}\n")
    servers, policy, audit = write_config(tmp_path, policy=four_eyes)
    elicit = _answering("accept", approve=True)

    async def go() -> str:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice"), elicit) as s:
            return text(await s.call_tool("run_python", {"code": "t_delete_file('/tmp/x')"}))

    out = run(go())
    assert elicit.seen == [] and "deleted" not in out
    assert "error: ApprovalDenied" in out and "alice is the run's principal and may not answer" in out
    log = tmp_path / "upstream.log"  # what the upstream server ran
    assert "delete_file" not in (log.read_text().split() if log.exists() else [])
    approvals = [r for r in audit_records(audit) if r["kind"] == "approval_resolved"]
    assert [a["verdict"] for a in approvals] == ["denied"]


def test_a_client_without_elicitation_falls_back_to_the_inbox(tmp_path: Path) -> None:
    """--approver inbox --store URL: the approval waits in the store, where `proctor approvals` answers it."""
    import subprocess
    import sys
    import threading

    servers, policy, audit = write_config(tmp_path, policy=POLICY_30S)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    answered: list[str] = []

    def answer() -> None:
        from proctor.store import RunStore

        s = RunStore.open(store)
        try:
            for _ in range(600):
                pending = s.list_approvals()
                if pending:
                    # (as the OS user running the test: `--as` needs the policy's approval.os_users mapping)
                    # (--audit: the server's trail, whose key for answers seals the answer)
                    out = subprocess.run([sys.executable, "-m", "proctor.cli", "approvals", "approve", pending[0].id,
                                          "--store", store, "--audit", str(audit)], capture_output=True, text=True,
                                         timeout=120)
                    answered.append(out.stdout + out.stderr)
                    return
                threading.Event().wait(0.1)
        finally:
            s.close()

    helper = threading.Thread(target=answer)
    helper.start()

    async def go() -> str:
        args = serve_args(servers, policy, audit, "--user", "alice", "--approver", "inbox", "--store", store)
        async with stdio_session(args) as s:
            return text(await s.call_tool("run_python", {"code": "t_delete_file('/tmp/z')"}))

    out = run(go())
    helper.join(120)
    assert answered, "no approval reached the store"
    assert "value: 'deleted /tmp/z'" in out
    # The session's program was waiting, not suspended: the answer says it goes on, not to resume a run the
    # store does not hold.
    assert "the program waiting for it goes on" in answered[0] and "runs resume" not in answered[0], answered[0]
    approvals = [r for r in audit_records(audit) if r["kind"] == "approval_resolved"]
    assert [a["verdict"] for a in approvals] == ["approve"] and approvals[0]["method"] == "os-user"


def test_proctor_halt_on_the_servers_store_stops_its_sessions_calls_until_lifted(tmp_path: Path) -> None:
    """A gate sharing a run store honours its halts: `proctor halt --principal alice --store URL` reaches the
    code-mode server's calls (the program sees the halt's id and reason), and lifting it lets them run."""
    servers, policy, audit = write_config(tmp_path)
    store = f"sqlite:///{tmp_path / 'runs.db'}"

    def halt(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "proctor.cli", "halt", *args, "--store", store,
                               "--audit", str(tmp_path / "ops.jsonl")], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[-1]

    async def go() -> tuple[str, str, str]:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice", "--store", store)) as s:
            before = text(await s.call_tool("run_python", {"code": "t_add(1, 2)"}))
            halt_id = halt("--principal", "alice", "--reason", "incident 7")
            await asyncio.sleep(1)  # the channel re-reads the store every 100 ms
            halted = text(await s.call_tool("run_python", {"code": "t_add(1, 2)"}))
            halt("--lift", halt_id, "--reason", "over")
            await asyncio.sleep(1)
            after = text(await s.call_tool("run_python", {"code": "t_add(1, 2)"}))
            return before, halted.replace(halt_id, "HALT"), after

    before, halted, after = run(go())
    assert "value: 3" in before and "value: 3" in after
    assert "error: ToolDenied: t_add: halted by HALT: incident 7" in halted
    kinds = [r["kind"] for r in audit_records(audit) if r["kind"].startswith("halt_")]
    assert kinds == ["halt_set", "halt_lifted"]  # the server's trail says when it began and stopped honouring it


def test_the_servers_policy_file_is_reloaded_when_it_changes_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    """A long-lived code-mode server is rolled a new policy without a restart: the next call after the file is
    replaced is decided by it (`policy_changed` says so); a broken file is refused and the last good one stays."""
    import os

    servers, policy, audit = write_config(tmp_path)

    def replace_policy(text: str) -> None:
        fresh = tmp_path / "policy.new"
        fresh.write_text(text)
        os.replace(fresh, policy)  # atomically, as docs/operations.md says to

    async def go() -> tuple[str, str, str]:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice")) as s:
            before = text(await s.call_tool("run_python", {"code": "t_add(1, 2)"}))
            replace_policy(POLICY.replace("t_add: {side_effect: read}", "t_add: {side_effect: write}"))
            await asyncio.sleep(1.2)  # the file is looked at every 500 ms
            after = text(await s.call_tool("run_python", {"code": "t_add(1, 2)"}))
            replace_policy("version: 1\nrules: [{name: x, decision: alow}]\n")
            await asyncio.sleep(1.2)
            broken = text(await s.call_tool("run_python", {"code": "t_add(1, 2)"}))
            return before, after, broken

    before, after, broken = run(go())
    assert "value: 3" in before
    assert "error: ToolDenied: t_add: denied: no rule matched" in after and "ToolDenied" in broken
    records = audit_records(audit)
    (changed,) = [r for r in records if r["kind"] == "policy_changed"]
    intents = [r["policy_sha256"] for r in records if r["kind"] == "call_intent"]
    assert intents == [changed["old_sha256"], changed["new_sha256"], changed["new_sha256"]]


def test_a_stdio_server_stopped_by_sigterm_ends_its_run_as_interrupted(tmp_path: Path) -> None:
    servers, policy, audit = write_config(tmp_path)
    proc = subprocess.Popen([sys.executable, *serve_args(servers, policy, audit)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        raw_run_python(proc, "t_add(2, 3)")
        assert "value: 5" in proc.stdout.readline().decode()
        proc.terminate()
        assert proc.wait(60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdin.close()
        proc.stdout.close()
    finished = [r for r in audit_records(audit) if r["kind"] == "run_finished"]
    assert [(f["status"], f["error"], f["calls"]["ok"]) for f in finished] == [
        ("interrupted", "interrupted by SIGTERM", 1)]


def test_a_shadow_policy_decides_every_call_beside_the_servers_and_never_acts(tmp_path: Path) -> None:
    """`--shadow P`: a candidate that would deny `t_add` changes nothing the client sees; each disagreement is a
    `shadow_decision` record with both decisions."""
    servers, policy, audit = write_config(tmp_path)
    candidate = tmp_path / "candidate.yaml"
    candidate.write_text(POLICY.replace("rules:\n", "rules:\n  - name: no-adding\n    match: {tool: t_add}\n"
                                                    "    decision: deny\n", 1))

    async def go() -> str:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice", "--shadow",
                                            str(candidate))) as s:
            return text(await s.call_tool("run_python", {"code": "[t_add(1, 2), t_get_weather('Oslo')]"}))

    out = run(go())
    assert "value: [3, " in out
    records = audit_records(audit)
    [disagreement] = [r for r in records if r["kind"] == "shadow_decision"]
    assert disagreement["tool"] == "t_add" and disagreement["enforced"]["decision"] == "allow"
    assert (disagreement["shadow"]["decision"], disagreement["shadow"]["rules"]) == ("deny", ["no-adding"])


def test_a_bad_shadow_policy_stops_the_server_before_it_serves(tmp_path: Path) -> None:
    servers, policy, audit = write_config(tmp_path)
    bad = tmp_path / "candidate.yaml"
    bad.write_text("version: 1\ndefault: maybe\n")
    done = subprocess.run([sys.executable, *serve_args(servers, policy, audit, "--shadow", str(bad))],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 1 and f"{bad}:2:" in done.stderr


def test_a_redacted_argument_is_not_in_clear_in_what_the_clients_model_reads(tmp_path: Path) -> None:
    """The program's output, value and error reach the client's model scrubbed of the values of arguments the policy
    redacts: the result leaves for the client and its model provider."""
    secret = "Zanzibar-4111"
    policy_text = POLICY.replace("t_get_weather: {side_effect: read}",
                                 "t_get_weather: {side_effect: read, redact: [city]}")
    servers, policy, audit = write_config(tmp_path, policy=policy_text)

    async def go() -> Any:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice")) as s:
            return await s.call_tool("run_python", {"code": (
                f"c = {secret!r}\nw = t_get_weather(c)\nprint('asked for', c)\n"
                "raise ValueError('no weather in ' + c)")})

    result = run(go())
    shown = json.dumps(result.model_dump(mode="json"))
    assert secret not in shown and "[redacted]" in shown and "t_get_weather  allow     ok" in shown
    assert secret not in audit.read_text()


PER_USER = POLICY.replace("budgets:\n", "budgets:\n  - name: per-user\n    per: principal\n    limit: {calls: 3}\n", 1)


def test_a_per_principal_budget_spans_a_users_sessions_on_two_servers_sharing_a_redis_ledger(
        tmp_path: Path, redis_server: Any) -> None:
    """`--ledger redis://…`: budgets wider than a run (here 3 calls per principal) count alice's calls in every
    session, whichever `proctor mcp serve` process serves it."""
    servers, policy, audit = write_config(tmp_path, policy=PER_USER)
    args = serve_args(servers, policy, audit, "--user", "alice", "--ledger", redis_server.url)
    other = serve_args(servers, policy, tmp_path / "other-audit.jsonl", "--user", "alice", "--ledger", redis_server.url)
    program = ("got = []\nfor i in range(2):\n    try:\n        got.append(t_add(i, 1))\n"
               "    except BudgetExceeded:\n        got.append('refused')\ngot")

    async def go() -> tuple[str, str]:
        async with stdio_session(args) as first, stdio_session(other) as second:
            return (text(await first.call_tool("run_python", {"code": program})),
                    text(await second.call_tool("run_python", {"code": program})))

    one, two = run(go())
    assert "value: [1, 2]" in one and "value: [1, 'refused']" in two


def test_a_per_principal_budget_without_a_shared_ledger_stops_the_server_saying_how_to_share_it(
        tmp_path: Path) -> None:
    servers, policy, audit = write_config(tmp_path, policy=PER_USER)
    env = {k: v for k, v in __import__("os").environ.items() if k != "PROCTOR_LEDGER"}
    done = subprocess.run([sys.executable, *serve_args(servers, policy, audit)], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, env=env)
    assert done.returncode == 1 and "PROCTOR_LEDGER=redis://" in done.stderr, done.stderr


def test_labels_reach_the_policy_and_an_audit_key_signs_the_servers_checkpoints(tmp_path: Path) -> None:
    """`--label env=prod` is `run.labels.env` in conditions; `--audit-key` signs the log as `proctor run`'s."""
    from proctor.cli import main

    labelled = POLICY.replace("rules:\n", "rules:\n  - name: no-adding-in-prod\n    match: {tool: t_add}\n"
                                          "    when: \"run.labels.env == 'prod'\"\n    decision: deny\n", 1)
    servers, policy, audit = write_config(tmp_path, policy=labelled)
    key = tmp_path / "audit.key"
    assert main(["audit", "keygen", str(key)]) == 0

    async def go(*extra: str) -> str:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice", *extra)) as s:
            return text(await s.call_tool("run_python", {"code": "t_add(1, 2)"}))

    assert "no-adding-in-prod" in run(go("--label", "env=prod", "--audit-key", str(key)))
    started = [r for r in audit_records(audit) if r["kind"] == "run_started"]
    assert started[-1]["labels"] == {"env": "prod", "via": "mcp-code-mode"}
    verify = subprocess.run([sys.executable, "-m", "proctor.cli", "audit", "verify", str(audit), "--pubkey",
                             f"{key}.pub", "--json"], capture_output=True, text=True, timeout=60)
    report = json.loads(verify.stdout)
    assert verify.returncode == 0 and report["ok"] and report["signed_checkpoints"] >= 1, report


def test_a_client_that_vanishes_during_a_program_has_its_run_ended_saying_so(tmp_path: Path) -> None:
    """The client's process dies while a program runs (both pipes close): the client closed the connection, so
    the run ends in the trail as done (never 'interrupted by ExceptionGroup') and the server exits 0 without a
    traceback."""
    import time

    servers, policy, audit = write_config(tmp_path)
    proc = subprocess.Popen([sys.executable, *serve_args(servers, policy, audit, "--import", "time")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        raw_run_python(proc, "t_add(2, 3)\nimport time\ntime.sleep(3)")
        deadline = time.monotonic() + 60
        while not [r for r in audit_records(audit) if r["kind"] == "call_outcome"] if audit.exists() else True:
            assert time.monotonic() < deadline, "the program made no call"
            time.sleep(0.1)
        proc.stdin.close()  # the client is gone, mid-program
        proc.stdout.close()
        status = proc.wait(60)
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stderr.close()
    assert "Traceback" not in err, err
    assert status == 0
    finished = [r for r in audit_records(audit) if r["kind"] == "run_finished"]
    assert [(f["status"], f["calls"]["ok"], "error" in f) for f in finished] == [("done", 1, False)]


def test_the_prompt_shows_the_call_asked_about_on_a_long_line(tmp_path: Path) -> None:
    """The program line is cut to a readable length around the call asked about, not from the line's start: a
    padded first statement (or an earlier call on the same line) must not fill the part the user sees."""
    servers, policy, audit = write_config(tmp_path)
    elicit = _answering("decline")
    padding = "a" * 400

    async def go() -> str:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice"), elicit) as s:
            code = f"note = '{padding}'; t_delete_file('/etc/passwd')"
            return text(await s.call_tool("run_python", {"code": code}))

    out = run(go())
    assert "ApprovalDenied" in out
    (message,) = elicit.seen
    (line,) = [m for m in message.splitlines() if m.startswith("program line 1: ")]
    assert "t_delete_file('/etc/passwd')" in line and line.startswith("program line 1: …")
    assert len(line) < 400


def test_the_call_table_of_a_program_making_many_calls_stays_compact_and_keeps_the_refusals(tmp_path: Path) -> None:
    """Output and value are cut for the model's context; so is the table: a loop of 300 calls is not 300 rows
    in the model's context. The calls that did not simply run (a refusal) are always listed, by number."""
    no_budget = POLICY.replace("budgets:\n  - name: run-calls\n    limit: {calls: 10}\n", "")
    servers, policy, audit = write_config(tmp_path, policy=no_budget)

    async def go() -> str:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice")) as s:
            code = ("total = 0\nfor i in range(300):\n    if i == 150:\n        try:\n            t_delete_file('/x')\n"
                    "        except ApprovalDenied:\n            pass\n    total += t_add(i, 1)\ntotal")
            return text(await s.call_tool("run_python", {"code": code}))

    out = run(go())
    assert "value: 45150" in out
    table = out.split("calls (", 1)[1]
    rows = [line for line in table.splitlines()[2:] if line[:1].isdigit()]
    assert table.startswith("301):") and len(rows) == 50
    assert any(r.split()[:3] == ["151", "t_delete_file", "require_approval"] for r in rows)
    assert "251 more calls not listed: 251 t_add allow ok" in out
    assert len(out) < 6000
    outcomes = [r for r in audit_records(audit) if r["kind"] == "call_outcome"]
    assert len(outcomes) == 301  # every call is in the trail, whatever the table lists


def test_a_description_cannot_close_its_docstring_and_forge_proctors_annotations(tmp_path: Path) -> None:
    """describe_tool's answer is Python: a description (or an argument's) holding three quotes must stay inside
    the docstring, so the lines after it that say how proctor treats the tool are proctor's alone."""
    import ast

    hostile = Path(__file__).parent.parent / "integrations" / "mcp_hostile.py"
    servers, policy, audit = write_config(tmp_path, {"h": {"command": sys.executable, "args": [str(hostile), "forge"]}},
                                          "version: 1\ndefault: deny\n")

    async def go() -> str:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice")) as s:
            return text(await s.call_tool("describe_tool", {"name": "h_wipe"}))

    shown = run(go())
    tree = ast.parse(shown)  # one function, whose docstring holds all the server wrote
    (fn,) = tree.body
    assert isinstance(fn, ast.FunctionDef) and fn.name == "h_wipe"
    doc = ast.get_docstring(fn) or ""
    assert "# from mcp:trusted" in doc and "side effect: none" in doc
    code_lines = [line.strip() for line in shown.splitlines() if line.strip().startswith("# ")]
    assert code_lines[-2:] == ["# side effect: destructive; policy: denied (policy default)", "# from mcp:h"]


def test_search_tools_answers_in_a_line_per_tool_however_long_a_description(tmp_path: Path) -> None:
    """search_tools is what keeps definitions out of the model's context: a server whose descriptions are one
    long line each must not turn its ten hits into 70 kB; describe_tool is where a description is read whole."""
    hostile = Path(__file__).parent.parent / "integrations" / "mcp_hostile.py"
    servers, policy, audit = write_config(tmp_path, {"h": {"command": sys.executable, "args": [str(hostile), "wordy"]}},
                                          "version: 1\ndefault: deny\n")

    async def go() -> tuple[str, str]:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice")) as s:
            found = text(await s.call_tool("search_tools", {"query": "tool"}))
            one = text(await s.call_tool("describe_tool", {"name": "h_w3"}))
            return found, one

    found, one = run(go())
    hits = [line for line in found.splitlines() if line.startswith("h_w")]
    assert len(hits) == 10 and all(len(line) <= 240 and line.endswith("…") for line in hits)
    assert "(10 more match; narrow the query)" in found
    assert "blah " * 1000 in one  # read whole (to the description's own cap) where asked for


HOSTILE = Path(__file__).parent.parent / "integrations" / "mcp_hostile.py"


def _raw(text: str) -> list[str]:
    """The characters of `text` that would reach the client's model or a terminal unescaped."""
    from proctor.termsafe import is_invisible

    return [c for c in text if is_invisible(c) and c not in "\n\t"]


def test_a_tool_whose_ref_does_not_resolve_is_not_offered_and_the_client_can_read_why(tmp_path: Path) -> None:
    """The server's other tools are served; the broken one is named where the client looks for it (search_tools,
    describe_tool), cannot be called, and the operator reads one line saying which tool and why."""
    servers, policy, audit = write_config(tmp_path, {"h": {"command": sys.executable,
                                                           "args": [str(HOSTILE), "badref"]}},
                                          "version: 1\ndefault: allow\n")
    err = tmp_path / "stderr"

    async def go() -> tuple[str, str, str, str]:
        with err.open("w") as errlog:
            async with stdio_session(serve_args(servers, policy, audit, "--user", "alice"), errlog=errlog) as s:
                found = text(await s.call_tool("search_tools", {"query": "peek"}))
                everything = text(await s.call_tool("search_tools", {"query": ""}))
                why = text(await s.call_tool("describe_tool", {"name": "h_peek"}))
                ran = text(await s.call_tool("run_python", {"code": (
                    "print(h_ok_tool())\ntry:\n    h_peek(x='a')\nexcept NameError:\n    print('not callable')")}))
                return found, everything, why, ran

    found, everything, why, ran = run(go())
    assert "not offered (their server's schemas cannot be used; describe_tool(name) says why): h_peek" in found
    assert everything.splitlines()[0].startswith("h_ok_tool()")
    assert "h_far, h_odd_in, h_odd_out, h_peek, h_tally" in everything
    assert why.startswith("h_peek is not offered: its inputSchema refers to '#/$defs/x' (at /properties/x), which "
                          "does not resolve within the schema") and why.endswith("(MCP server h)")
    assert "done" in ran and "not callable" in ran
    logged = [line for line in err.read_text().splitlines() if "is not offered" in line]
    assert len(logged) == 5 and "proctor mcp serve: h_peek is not offered: its inputSchema refers to '#/$defs/x'" \
        in logged[0] and logged[0].endswith("(MCP server h)")


def test_a_name_one_server_cannot_offer_and_another_offers_is_the_offered_tools(tmp_path: Path) -> None:
    """Server h lists x_peek with a broken $ref (not offered); server g offers x_peek: search_tools and describe_tool
    speak of g's, which a program calls, and do not call it "not offered"."""
    hostile = {"command": sys.executable, "proctor": {"prefix": "x_"}}
    servers, policy, audit = write_config(tmp_path, {"h": {**hostile, "args": [str(HOSTILE), "badref"]},
                                                     "g": {**hostile, "args": [str(HOSTILE), "peek"]}},
                                          "version: 1\ndefault: allow\n")

    async def go() -> tuple[str, str, str]:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice")) as s:
            found = text(await s.call_tool("search_tools", {"query": "peek"}))
            why = text(await s.call_tool("describe_tool", {"name": "x_peek"}))
            ran = text(await s.call_tool("run_python", {"code": "x_peek()"}))
            return found, why, ran

    found, why, ran = run(go())
    assert found.startswith("x_peek()") and "not offered" not in found, found
    assert "def x_peek()" in why and "# from mcp:g" in why, why
    assert "done" in ran, ran


def test_what_an_upstream_server_writes_reaches_the_clients_model_escaped(tmp_path: Path) -> None:
    """ANSI escapes, C1 controls, bidi overrides and isolates, invisible characters in descriptions, titles, enum
    values, argument descriptions and the errors calls return: visible escapes in search_tools, describe_tool and
    run_python's result (its table and error text), never the characters themselves."""
    servers, policy, audit = write_config(tmp_path, {"h": {"command": sys.executable,
                                                           "args": [str(HOSTILE), "controls"]}},
                                          "version: 1\ndefault: allow\n")
    err = tmp_path / "stderr"

    async def go() -> list[str]:
        with err.open("w") as errlog:
            async with stdio_session(serve_args(servers, policy, audit, "--user", "alice"), errlog=errlog) as s:
                return [text(await s.call_tool("search_tools", {"query": "paint"})),
                        text(await s.call_tool("describe_tool", {"name": "h_paint"})),
                        text(await s.call_tool("describe_tool", {"name": "h_refuse"})),
                        text(await s.call_tool("run_python", {"code": (
                            "try:\n    h_paint(colour='blue')\nexcept ToolFailed as e:\n    print(e)\n"
                            "h_refuse()")})),
                        text(await s.call_tool("run_python", {"code": "h_paint(colour='green')"}))]

    outs = run(go())
    for out in outs:
        assert _raw(out) == [], out
    found, paint, refuse, ran, refused = outs
    assert "# Paint a wall.\\x1b[2J\\x1b[1A\\x9b31m\\u202egnp.exe" in found
    assert "Literal['red\\x1b[2J" in paint and "the colour\\x1b[2J" in paint and "which room\\x1b[2J" in paint
    assert "Refuses.\\x1b[2J" in refuse
    assert "wet paint\\x1b[2J" in ran and "no such wall\\x1b[2J" in ran  # the call table and the error
    assert "red\\x1b[2J" in refused and "denied" in refused
    assert _raw(err.read_text()) == []


def test_the_rest_of_what_an_upstream_definition_and_result_carry_reaches_the_client_escaped(tmp_path: Path) -> None:
    """Defaults, examples, consts, formats, the titles of nested and output types (TypedDict names), output
    descriptions, an annotations title, a log notification sent during the call and the call's own result: none
    of it reaches the client's model raw through search_tools, describe_tool or run_python."""
    servers, policy, audit = write_config(tmp_path, {"h": {"command": sys.executable,
                                                           "args": [str(HOSTILE), "controls-more"]}},
                                          "version: 1\ndefault: allow\n")

    async def go() -> list[str]:
        async with stdio_session(serve_args(servers, policy, audit, "--user", "alice")) as s:
            return [text(await s.call_tool("search_tools", {"query": ""})),
                    text(await s.call_tool("describe_tool", {"name": "h_mix"})),
                    text(await s.call_tool("run_python", {"code": "r = h_mix()\nprint(r)\nr"})),
                    text(await s.call_tool("run_python", {"code": "h_mix(shade='x')"}))]

    outs = run(go())
    for out in outs:
        assert _raw(out) == [], out
    _, described, ran, refused = outs
    assert "'''what comes back\\x1b[2J" in described and "the words\\x1b[2J" in described
    assert "Literal['dark\\x1b[2J" in described
    assert "'mixed\\x1b[2J" in ran and "dark\\x1b[2J" in refused
