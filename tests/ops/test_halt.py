"""Halts: `proctor halt` on Redis and on SQLite/PostgreSQL run stores, the channels gates read, failing closed."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fleet_engines import PostgresServer, RedisServer

from proctor.audit.lines import read_records
from proctor.cli import main
from proctor.errors import ToolDenied
from proctor.halt import (
    OUTAGE_ID,
    Halt,
    HaltChannel,
    HaltError,
    MemoryHalts,
    PolledHalts,
    halt_refusal,
    install_signal_halt,
    new_halt,
)
from proctor.halt.redis import RedisHalts
from proctor.halt.sql import StoreHaltBackend, StoreHalts


def _wait_for(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def test_scopes_match_what_they_name() -> None:
    halts = MemoryHalts()
    assert halts.check("send_email", "mailer", "alice", "run_1") is None
    tool = halts.set(scope="tool", value="send_*", reason="mail outage")
    assert halts.check("send_email", None, None, "run_1") == tool
    assert halts.check("lookup", None, None, "run_1") is None
    halts.lift(tool.id)
    for scope, value, hit, miss in (
        ("agent", "mailer", ("t", "mailer", None, "r"), ("t", "other", None, "r")),
        ("principal", "alice", ("t", None, "alice", "r"), ("t", None, "bob", "r")),
        ("run", "run_9", ("t", None, None, "run_9"), ("t", None, None, "run_8")),
        ("all", None, ("t", None, None, "r"), None),
    ):
        h = halts.set(scope=scope, value=value, reason="why")  # type: ignore[arg-type]
        assert halts.check(*hit) == h
        if miss is not None:
            assert halts.check(*miss) is None
        halts.lift(h.id)
    with pytest.raises(HaltError, match="no active halt"):
        halts.lift("halt_nope")
    with pytest.raises(HaltError, match="needs the tool"):
        new_halt("tool", None, "why")
    with pytest.raises(HaltError, match="reason"):
        new_halt("all", None, "  ")


def test_a_halt_matches_a_name_written_in_another_unicode_form_and_never_a_look_alike() -> None:
    """"José" typed on one machine (é as one code point) and the principal as another wrote it (e + a combining
    accent) are the same text: the halt stops it. A look-alike from another script ("alice" with a Cyrillic a,
    U+0430) is another name, as it is to budgets and approvals: not stopped by a halt of "alice"."""
    halts = MemoryHalts()
    composed, decomposed = "Jos\u00e9", "Jose\u0301"
    for scope, at in (("principal", 2), ("agent", 1), ("tool", 0)):
        for written, called in ((composed, decomposed), (decomposed, composed)):
            h = halts.set(scope=scope, value=written, reason="why")  # type: ignore[arg-type]
            fields: list[Any] = ["t", None, None, "run_1"]
            fields[at] = called
            assert halts.check(*fields) == h, (scope, written)
            halts.lift(h.id)
    h = halts.set(scope="tool", value="envoy\u00e9_*", reason="glob")
    assert halts.check("envoye\u0301_mail", None, None, "r") == h
    halts.lift(h.id)
    h = halts.set(scope="principal", value="alice", reason="why")
    assert halts.check("t", None, "\u0430lice", "r") is None
    halts.lift(h.id)


def test_an_agent_or_principal_halt_written_as_a_glob_stops_the_names_it_matches() -> None:
    """`proctor halt --agent 'research*'` printed "halted" and stopped nothing, the glob compared as a name: an
    operator's pattern matches as --tool's does (a name that holds the character still matches itself)."""
    halts = MemoryHalts()
    agents = halts.set(scope="agent", value="research*", reason="runaway researchers")
    assert halts.check("t", "research-eu", None, "r") == agents
    assert halts.check("t", "writer", None, "r") is None
    assert halts.check("t", None, None, "r") is None
    halts.lift(agents.id)
    people = halts.set(scope="principal", value="*@contractor.example", reason="contract ended")
    assert halts.check("t", None, "ann@contractor.example", "r") == people
    assert halts.check("t", None, "ann@example.com", "r") is None
    halts.lift(people.id)
    literal = halts.set(scope="principal", value="odd*name", reason="why")
    assert halts.check("t", None, "odd*name", "r") == literal


def test_refusal_names_the_halt() -> None:
    halt = new_halt("all", None, "incident 42")
    err = halt_refusal("send_email", halt)
    assert isinstance(err, ToolDenied)
    assert str(err) == f"send_email: halted by {halt.id}: incident 42"


def test_signal_halts_this_process() -> None:
    halts = MemoryHalts()
    uninstall = install_signal_halt(halts)
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        _wait_for(lambda: halts.check("t", None, None, "r") is not None)
        found = halts.check("t", None, None, "r")
        assert found is not None and "SIGUSR2" in found.reason
    finally:
        uninstall()


def test_backend_rows_are_not_trusted() -> None:
    with pytest.raises(HaltError, match="scope"):
        Halt.from_dict({"id": "h1", "scope": "everything", "value": None, "reason": "r", "by": "x", "at_ns": 1})
    with pytest.raises(HaltError, match="id"):
        Halt.from_dict({"id": "bad id\n", "scope": "all", "value": None, "reason": "r", "by": "x", "at_ns": 1})


def test_a_halt_id_with_a_trailing_newline_is_not_an_id() -> None:
    """An id from a backend is checked whole: a line break after it (which a `$` anchor lets through) would
    reach refusals and audit records as part of "halted by ID"."""
    for bad in ("halt_x\n", "halt_x\r", "\nhalt_x"):
        with pytest.raises(HaltError, match="id"):
            Halt.from_dict({"id": bad, "scope": "all", "value": None, "reason": "r", "by": "x", "at_ns": 1})


def test_a_grace_period_that_is_not_a_number_is_refused() -> None:
    """NaN compares false with everything: as a grace period it would pass the check against refresh_s and then
    never run out, so a channel whose backend is gone would never fail closed."""
    with pytest.raises(HaltError, match="grace_s"):
        PolledHalts(list, "x", grace_s=float("nan"))


def test_polled_channel_fails_closed_after_grace() -> None:
    state = {"up": True}

    def read() -> list[Halt]:
        if not state["up"]:
            raise ConnectionError("connection refused")
        return []

    channel = PolledHalts(read, "test://backend", refresh_s=0.02, grace_s=0.3)
    try:
        assert channel.check("t", None, None, "r") is None
        state["up"] = False
        time.sleep(0.1)
        assert channel.check("t", None, None, "r") is None  # within the grace: the last snapshot decides
        _wait_for(lambda: channel.check("t", None, None, "r") is not None)
        outage = channel.check("t", None, None, "r")
        assert outage is not None and outage.id == OUTAGE_ID
        assert "test://backend" in outage.reason and "connection refused" in outage.reason
        state["up"] = True
        _wait_for(lambda: channel.check("t", None, None, "r") is None)
    finally:
        channel.close()
    # Never read: refused from the start.
    state["up"] = False
    never = PolledHalts(read, "test://down", refresh_s=0.02, grace_s=0.3, wait_s=0.05)
    try:
        found = never.check("t", None, None, "r")
        assert found is not None and found.id == OUTAGE_ID and "never read" in found.reason
    finally:
        never.close()
    with pytest.raises(HaltError, match="refresh_s"):
        PolledHalts(read, "x", refresh_s=1.0)


def _cli_roundtrip(tmp_path: Path, backend: list[str], channel: HaltChannel, capsys: pytest.CaptureFixture[str]
                   ) -> None:
    audit = tmp_path / f"audit-{uuid.uuid4().hex[:6]}.jsonl"
    assert main(["halt", "--tool", "send_email", "--reason", "mail storm", *backend, "--audit", str(audit)]) == 0
    halt_id = capsys.readouterr().out.split()[-1]
    assert halt_id.startswith("halt_")
    _wait_for(lambda: channel.check("send_email", None, "alice", "run_1") is not None)
    found = channel.check("send_email", None, "alice", "run_1")
    assert found is not None and found.id == halt_id and found.reason == "mail storm"
    assert channel.check("lookup", None, "alice", "run_1") is None
    assert main(["halt", "--list", "--json", *backend]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [h["id"] for h in listed] == [halt_id]
    assert main(["halt", "--lift", halt_id, "--reason", "storm over", *backend, "--audit", str(audit)]) == 0
    capsys.readouterr()
    _wait_for(lambda: channel.check("send_email", None, "alice", "run_1") is None)
    assert main(["halt", "--lift", halt_id, "--reason", "again", *backend, "--audit", str(audit)]) == 1
    records, bad = read_records(audit)
    kinds = [(r["kind"], r.get("halt_id"), r.get("reason"), r.get("by"))
             for r in records if r["kind"].startswith("halt")]
    assert bad == 0
    who = kinds[0][3]
    assert kinds == [("halt_set", halt_id, "mail storm", who), ("halt_lifted", halt_id, "storm over", who)]
    assert who
    assert main(["audit", "verify", str(audit)]) == 0


def test_cli_on_redis(tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    channel = RedisHalts(redis_server.url)
    try:
        _cli_roundtrip(tmp_path, ["--ledger", redis_server.url], channel, capsys)
    finally:
        channel.close()


def test_cli_on_sqlite_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    channel = StoreHalts(url)
    try:
        _cli_roundtrip(tmp_path, ["--store", url], channel, capsys)
    finally:
        channel.close()


def test_cli_on_postgres_store(tmp_path: Path, postgres_server: PostgresServer,
                               capsys: pytest.CaptureFixture[str]) -> None:
    channel = StoreHalts(postgres_server.url)
    try:
        _cli_roundtrip(tmp_path, ["--store", postgres_server.url], channel, capsys)
    finally:
        channel.close()


def test_redis_outage_fails_closed(redis_server: RedisServer) -> None:
    channel = RedisHalts(redis_server.url, refresh_s=0.05, grace_s=0.5)
    try:
        assert channel.check("t", None, None, "r") is None
        redis_server.stop()
        _wait_for(lambda: channel.check("t", None, None, "r") is not None, 10)
        found = channel.check("t", None, None, "r")
        assert found is not None and found.id == OUTAGE_ID
    finally:
        channel.close()


def test_cli_usage(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PROCTOR_LEDGER", raising=False)
    monkeypatch.delenv("PROCTOR_STORE", raising=False)
    monkeypatch.delenv("PROCTOR_AUDIT", raising=False)
    store = ["--store", f"sqlite:///{tmp_path / 'runs.db'}"]
    assert main(["halt", "--all", *store, "--audit", str(tmp_path / "a.jsonl")]) == 2  # no --reason
    assert main(["halt", "--all", "--reason", "x", *store]) == 2  # no audit
    assert main(["halt", "--all", "--reason", "x", "--audit", str(tmp_path / "a.jsonl")]) == 2  # no backend
    assert main(["halt", *store]) == 2
    err = capsys.readouterr().err
    assert "--reason TEXT is required" in err and "--audit" in err and "--ledger redis://" in err
    assert main(["halt", "--lift", "halt_x", *store, "--audit", str(tmp_path / "a.jsonl")]) == 2  # no --reason
    err = capsys.readouterr().err  # a lift's reason is the log's, no program sees it
    assert "--reason TEXT is required: the audit log keeps why the halt was lifted" in err and "program" not in err


def test_a_halt_on_a_sqlite_store_that_does_not_exist_is_refused_not_kept_where_no_gate_reads(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped store path would get a fresh store of its own, the halt kept in it, "halted" printed, and no
    gate stopped: the command refuses instead, and makes no file."""
    typo = tmp_path / "rnus.db"
    audit = tmp_path / "a.jsonl"
    for url in (str(typo), f"sqlite:///{typo}"):
        capsys.readouterr()
        assert main(["halt", "--all", "--reason", "incident", "--store", url, "--audit", str(audit)]) == 1
        err = capsys.readouterr().err
        assert f"no run store at {typo}" in err and "stops no gate" in err
        assert main(["halt", "--list", "--store", url]) == 1
        assert main(["halt", "--lift", "halt_x", "--reason", "r", "--store", url, "--audit", str(audit)]) == 1
        assert not typo.exists()
    assert not audit.exists() or "halt_set" not in audit.read_text()
    real = tmp_path / "runs.db"
    StoreHaltBackend(f"sqlite:///{real}").close()  # a store the fleet's runs use
    assert main(["halt", "--all", "--reason", "incident", "--store", str(real), "--audit", str(audit)]) == 0


def test_mcp_serve_refuses_halts_named_at_a_sqlite_store_that_does_not_exist(tmp_path: Path) -> None:
    """`--halts PATH` names the halts a server honours: a mistyped path made a fresh store, and the server honoured
    its empty table while the fleet's halts were elsewhere. It refuses to start instead, and makes no file."""
    servers = tmp_path / "servers.json"
    servers.write_text('{"mcpServers": {}}')
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\nrules: []\n")
    typo = tmp_path / "rnus.db"
    assert main(["mcp", "serve", "--servers", str(servers), "--policy", str(policy), "--halts", str(typo),
                 "--audit", str(tmp_path / "audit.jsonl")]) == 1
    assert not typo.exists()


def test_a_store_row_holding_another_halts_id_fails_the_read(tmp_path: Path) -> None:
    """A row of the halts table is not trusted: one whose data names a halt other than its row's id (a copy of
    an active halt under a second row, which its lift would leave in force) fails the read, as Redis's does."""
    import sqlite3

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    backend = StoreHaltBackend(url)
    try:
        real = backend.set(new_halt("tool", "send_email", "incident", "ops"))
        db = sqlite3.connect(tmp_path / "runs.db")
        db.execute("INSERT INTO halts (id, set_at_ns, lifted_at_ns, data) VALUES (?, ?, NULL, ?)",
                   ("halt_forged", real.at_ns, json.dumps(real.as_dict())))
        db.commit()
        db.close()
        with pytest.raises(HaltError, match="halt_forged"):
            backend.list_halts()
        db = sqlite3.connect(tmp_path / "runs.db")
        db.execute("UPDATE halts SET data = 'not json' WHERE id = 'halt_forged'")
        db.commit()
        db.close()
        with pytest.raises(HaltError, match="cannot read the halts"):
            backend.list_halts()
    finally:
        backend.close()


def test_a_forged_redis_entry_fails_closed(redis_server: RedisServer) -> None:
    import redis

    channel = RedisHalts(redis_server.url, refresh_s=0.05, grace_s=0.3)
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert channel.check("t", None, None, "r") is None
        client.hset("proctor:halts", "halt_x", b'{"id": "halt_x", "scope": "all"}')  # no reason, no by
        _wait_for(lambda: channel.check("t", None, None, "r") is not None)
        found = channel.check("t", None, None, "r")
        assert found is not None and found.id == OUTAGE_ID and "not a halt" in found.reason
    finally:
        client.close()
        channel.close()


def test_a_gate_on_a_shared_channel_audits_halts_set_elsewhere_and_its_own(redis_server: RedisServer) -> None:
    from proctor.gate import Gate
    from proctor.halt.redis import RedisHaltBackend
    from proctor.policy import Policy
    from proctor.testing import InMemoryAudit

    prefix = f"proctor:halts:{uuid.uuid4().hex[:8]}"
    channel = RedisHalts(redis_server.url, prefix=prefix, refresh_s=0.02)
    other = RedisHaltBackend(redis_server.url, prefix=prefix)  # another process's `proctor halt`
    audit = InMemoryAudit()
    gate = Gate(Policy.from_dict({"version": 1, "rules": []}), audit=audit, halts=channel)
    try:
        elsewhere = other.set(new_halt("tool", "send_email", "mail storm", "ops-erin"))
        _wait_for(lambda: audit.of_kind("halt_set"))
        other.lift(elsewhere.id)
        _wait_for(lambda: audit.of_kind("halt_lifted"))
        mine = gate.halt("freeze", by="ops-frank")
        _wait_for(lambda: channel.check("t", None, None, "r") is not None)
        gate.lift_halt(mine.id, "thaw", by="ops-gus")
        _wait_for(lambda: channel.check("t", None, None, "r") is None)
        via = f"channel {channel.name}"
        records = [(r["kind"], r["halt_id"], r["by"], r["reason"], r["via"])
                   for r in audit.records if r["kind"].startswith("halt")]
        assert records == [("halt_set", elsewhere.id, "ops-erin", "mail storm", via),
                           ("halt_lifted", elsewhere.id, None, None, via),  # who lifted it recorded that
                           ("halt_set", mine.id, "ops-frank", "freeze", "api"),
                           ("halt_lifted", mine.id, "ops-gus", "thaw", "api")]
        assert audit.of_kind("halt_set")[1]["backend"] == channel.name
    finally:
        channel.close()
        other.close()


def _effect_gate(audit: Any = None, **kwargs: Any) -> tuple[Any, list[int]]:
    from proctor import Gate, Policy, tool

    runs: list[int] = []

    @tool(side_effect="write")
    def effect() -> int:
        """Do something."""
        runs.append(1)
        return len(runs)

    policy = Policy.from_dict({"version": 1, "default": "allow", "rules": []})
    return Gate(policy, tools=[effect], audit=audit, **kwargs), runs


def _halt_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    audit = tmp_path / f"audit-{uuid.uuid4().hex[:6]}.jsonl"
    assert main(["halt", *args, "--audit", str(audit)]) == 0
    return capsys.readouterr().out.split()[-1]


def test_a_gate_sharing_a_redis_ledger_honours_proctor_halt_on_that_ledger_without_being_told(
        tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`proctor halt --ledger URL` stops every gate that shares that ledger: one given the URL, one given a
    RedisLedger, one on $PROCTOR_LEDGER, with no `halts=`; one process channel serves them all."""
    from proctor.ledger.redis import RedisLedger
    from proctor.testing import InMemoryAudit

    url = redis_server.url
    audit = InMemoryAudit()
    by_url, runs = _effect_gate(audit, ledger=url)
    by_object, _ = _effect_gate(ledger=RedisLedger(url + "&timeout=2s"))
    monkeypatch.setenv("PROCTOR_LEDGER", url)
    by_env, _ = _effect_gate()
    assert by_url.halts.channels[1] is by_object.halts.channels[1] is by_env.halts.channels[1]  # one reader
    assert by_url.call("effect") == 1
    # The fleet's ledger URL as written, with the ledger's own options: the same Redis, the same halts.
    halt_id = _halt_cli(tmp_path, capsys, "--tool", "effect", "--reason", "incident 42",
                        "--ledger", url + "&timeout=2s&lease=30s")
    for gate in (by_url, by_object, by_env):
        _wait_for(lambda gate=gate: gate.halts.check("effect", None, None, "r") is not None)
        with pytest.raises(ToolDenied, match=f"effect: halted by {halt_id}: incident 42"):
            gate.call("effect")
    assert runs == [1]
    assert [r["halt_id"] for r in audit.of_kind("halt_set")] == [halt_id]  # audited where it honours
    _halt_cli(tmp_path, capsys, "--lift", halt_id, "--reason", "over", "--ledger", url)
    _wait_for(lambda: by_url.halts.check("effect", None, None, "r") is None)
    assert by_url.call("effect") == 2
    # The process's own halts (the API, a signal) still stop it, and a halt the gate sets stays this process's.
    mine = by_url.halt("local freeze")
    with pytest.raises(ToolDenied, match=mine.id):
        by_url.call("effect")
    assert by_object.halts.check("effect", None, None, "r") == mine  # the same process: gate_halts
    by_url.lift_halt(mine.id, "thaw")
    assert by_url.call("effect") == 3


def test_fleets_on_one_redis_under_their_own_prefixes_keep_their_own_halts(
        tmp_path: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    """A ledger's `prefix=` gives a fleet its own keys on a Redis other fleets use: its halts too. `proctor halt
    --ledger URL?prefix=team-a` stops team A's gates, not team B's, and team B's lift cannot end it."""
    from proctor.ledger.redis import RedisLedger

    url = redis_server.url
    team_a, a_runs = _effect_gate(ledger=url + "&prefix=team-a")
    team_b, b_runs = _effect_gate(ledger=RedisLedger(url, prefix="team-b"))
    plain, plain_runs = _effect_gate(ledger=url)
    halt_id = _halt_cli(tmp_path, capsys, "--all", "--reason", "team a incident", "--ledger", url + "&prefix=team-a")
    _wait_for(lambda: team_a.halts.check("effect", None, None, "r") is not None)
    with pytest.raises(ToolDenied, match=f"halted by {halt_id}: team a incident"):
        team_a.call("effect")
    time.sleep(0.5)  # past two refreshes of the other fleets' channels
    assert team_b.call("effect") == 1 and plain.call("effect") == 1
    audit = tmp_path / "b.jsonl"
    assert main(["halt", "--lift", halt_id, "--reason", "not ours", "--ledger", url + "&prefix=team-b",
                 "--audit", str(audit)]) == 1
    assert main(["halt", "--list", "--json", "--ledger", url]) == 0
    capsys.readouterr()
    assert main(["halt", "--list", "--json", "--ledger", url + "&prefix=team-a"]) == 0
    assert [h["id"] for h in json.loads(capsys.readouterr().out)] == [halt_id]
    _halt_cli(tmp_path, capsys, "--lift", halt_id, "--reason", "over", "--ledger", url + "&prefix=team-a")
    _wait_for(lambda: team_a.halts.check("effect", None, None, "r") is None)
    assert team_a.call("effect") == 1
    assert (a_runs, b_runs, plain_runs) == ([1], [1], [1])


def test_a_gate_made_while_its_redis_is_down_refuses_then_serves_once_it_is_up(tmp_path: Path) -> None:
    """Its halts never read, every call is refused (fail closed, saying why); the first call after Redis is
    back reads them and runs, without waiting for the channel's next refresh."""
    server = RedisServer(tmp_path)
    gate, runs = _effect_gate(ledger=server.url + "&timeout=500ms")
    try:
        with pytest.raises(ToolDenied, match=r"halted by halt_channel_unreachable: the halt channel .* cannot be "
                                             r"read \(never read"):
            gate.call("effect")
        assert runs == []
        server.start()
        assert gate.call("effect") == 1
    finally:
        gate.ledger.close()
        server.stop()


@pytest.mark.sandbox
@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_an_agent_whose_runs_share_a_store_honours_proctor_halt_on_that_store(
        engine: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]) -> None:
    """`proctor halt --store URL` stops the calls of an agent given that store (`store=`), mid-run."""
    from proctor import CodeAgent, Policy, ScriptedModel, tool

    url = (f"sqlite:///{tmp_path / 'runs.db'}" if engine == "sqlite"
           else request.getfixturevalue("postgres_server").url)
    ran: list[str] = []

    @tool(side_effect="write")
    def send(to: str) -> str:
        """Send a message.

        Args:
            to: who gets it
        """
        ran.append(to)
        return "sent"

    policy = Policy.from_dict({"version": 1, "default": "allow", "rules": []})
    program = "try:\n    send(to='a')\nexcept ToolDenied as e:\n    print('refused:', e)\n"
    agent = CodeAgent([send], ScriptedModel([f"```python\n{program}\n```", "```python\nfinal_answer('ok')\n```"]),
                      policy, audit=str(tmp_path / "audit.jsonl"), store=url, sandbox="process")
    try:
        halt_id = _halt_cli(tmp_path, capsys, "--tool", "send", "--reason", "mail outage", "--store", url)
        _wait_for(lambda: agent.gate.halts.check("send", None, None, "r") is not None)
        result = agent.run("send it")
        assert ran == []
        assert f"halted by {halt_id}: mail outage" in result.steps[0].observation
    finally:
        agent.close()


def test_a_shared_channel_stops_reading_once_no_gate_watches_it(tmp_path: Path) -> None:
    """A process that makes gates on many stores over its life keeps no reader for those it dropped."""
    import gc
    import threading

    from proctor.store.sqlite import SQLiteRunStore

    store = SQLiteRunStore(str(tmp_path / "runs.db"))
    first, _ = _effect_gate()
    second, _ = _effect_gate()
    for gate in (first, second):
        gate.honour_halts_of(store)
        gate.honour_halts_of(store)  # once is enough: no second watcher, no second record per halt
    del gate

    def readers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("proctor-halts") and str(tmp_path) in t.name]

    assert len(readers()) == 1
    assert first.halts.channels[1] is second.halts.channels[1]
    assert first.halts.channels[1].watchers == 2
    del first
    gc.collect()
    time.sleep(0.3)
    assert len(readers()) == 1  # the second gate still reads through it
    del second
    gc.collect()
    _wait_for(lambda: not readers())
    again, _ = _effect_gate()
    again.honour_halts_of(store)  # a new gate opens a new one
    assert len(readers()) == 1
    del again
    gc.collect()
    _wait_for(lambda: not readers())
    store.close()


def test_a_halt_in_force_when_a_gate_starts_is_in_its_trail_before_the_calls_it_refuses(
        redis_server: RedisServer) -> None:
    """A gate made while a halt was in force refused calls naming a halt its trail never recorded, and later
    recorded its `halt_lifted` alone: its trail now says when it began honouring it, who set it and why."""
    from proctor.halt.redis import RedisHaltBackend
    from proctor.testing import InMemoryAudit

    prefix = f"proctor:halts:{uuid.uuid4().hex[:8]}"
    other = RedisHaltBackend(redis_server.url, prefix=prefix)  # another process's `proctor halt`, earlier
    before = other.set(new_halt("tool", "effect", "mail storm", "ops-erin"))
    channel = RedisHalts(redis_server.url, prefix=prefix, refresh_s=0.02)
    audit = InMemoryAudit()
    try:
        gate, runs = _effect_gate(audit, halts=channel)
        with pytest.raises(ToolDenied, match=f"halted by {before.id}: mail storm"):
            gate.call("effect", {})
        other.lift(before.id)
        _wait_for(lambda: audit.of_kind("halt_lifted"))
        kinds = [r["kind"] for r in audit.records]
        assert kinds.index("halt_set") < kinds.index("call_intent") and runs == []
        (found,) = audit.of_kind("halt_set")
        assert (found["halt_id"], found["by"], found["reason"], found["via"]) == (
            before.id, "ops-erin", "mail storm", "in force when this gate started")
    finally:
        channel.close()
        other.close()


def test_a_halt_in_force_when_a_gate_starts_while_its_backend_is_down_is_in_its_trail_once_read(
        redis_server: RedisServer) -> None:
    """The backend cannot be reached when the gate starts (it refuses every call meanwhile): the halts in force
    are not known then. Its first good read finds one: the trail records it (who set it, why) before the calls it
    refuses, not only in them, and not its lifting alone."""
    from proctor.halt.redis import RedisHaltBackend
    from proctor.testing import InMemoryAudit

    prefix = f"proctor:halts:{uuid.uuid4().hex[:8]}"
    other = RedisHaltBackend(redis_server.url, prefix=prefix)  # another process's `proctor halt`, earlier
    before = other.set(new_halt("tool", "effect", "mail storm", "ops-erin"))
    other.close()
    redis_server.stop()  # (its append-only file keeps the halt for the restart)
    channel = RedisHalts(redis_server.url, prefix=prefix, refresh_s=0.02, grace_s=0.5)
    audit = InMemoryAudit()
    other = None
    try:
        gate, runs = _effect_gate(audit, halts=channel)
        assert audit.of_kind("halt_set") == []  # nothing could be read
        redis_server.start()
        _wait_for(lambda: channel.check("effect", None, None, "r") is not None
                  and channel.check("effect", None, None, "r").id == before.id)  # type: ignore[union-attr]
        with pytest.raises(ToolDenied, match=f"halted by {before.id}: mail storm"):
            gate.call("effect", {})
        other = RedisHaltBackend(redis_server.url, prefix=prefix)
        other.lift(before.id)
        _wait_for(lambda: audit.of_kind("halt_lifted"))
        kinds = [r["kind"] for r in audit.records]
        assert kinds.index("halt_set") < kinds.index("call_intent") and runs == []
        (found,) = audit.of_kind("halt_set")
        assert (found["halt_id"], found["by"], found["reason"]) == (before.id, "ops-erin", "mail storm")
        assert "first read" in found["via"], found
    finally:
        channel.close()
        if other is not None:
            other.close()


def test_a_halt_set_as_a_gate_starts_is_recorded_once(redis_server: RedisServer) -> None:
    """A halt the channel reads while the gate is starting is found both in what is in force and as a new halt:
    one `halt_set` in the trail, not two."""
    from proctor.halt import HaltEvent
    from proctor.testing import InMemoryAudit

    channel = RedisHalts(redis_server.url, prefix=f"proctor:halts:{uuid.uuid4().hex[:8]}", refresh_s=0.02)
    audit = InMemoryAudit()
    try:
        halt = channel.backend.set(new_halt("tool", "effect", "mail storm", "ops-erin"))
        _wait_for(lambda: channel.active() != ())
        gate, _ = _effect_gate(audit, halts=channel)  # in force now: recorded as such
        # The channel's own news of it, as its reading thread tells a watcher that came a moment earlier.
        gate._on_halt(HaltEvent("halt_set", halt, halt.by, halt.reason, f"channel {channel.name}"))
        assert [r["halt_id"] for r in audit.of_kind("halt_set")] == [halt.id]
    finally:
        channel.close()
