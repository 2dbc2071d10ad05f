"""`proctor policy replay`: recorded calls of a real gate's audit log decided again under a new policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fleet_engines import PostgresServer

from proctor.audit import AuditLog
from proctor.audit.base import AuditSink
from proctor.cli import main
from proctor.errors import ProctorError
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.policy.replay import replay_log
from proctor.tools import tool


@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return f"order {order}"


@tool(side_effect="external", cost=1)
def send_email(to: str, body: str) -> str:
    """Send an email.

    Args:
        to: Recipient.
        body: Text.
    """
    return f"sent to {to}"


@tool(side_effect="destructive")
def charge(card: str, amount: int) -> str:
    """Charge a card.

    Args:
        card: Card number.
        amount: Amount.
    """
    return "charged"


OLD = """
version: 1
tools:
  charge: {side_effect: destructive, redact: [card]}
rules:
  - {name: reads, match: {side_effect: read}, decision: allow}
  - name: mail
    match: {tool: send_email}
    when: "args.to.endsWith('@example.com')"
    decision: allow
  - {name: charges, match: {tool: charge}, decision: allow}
"""


def _record(tmp_path: Path, audit: AuditSink | None = None) -> Path:
    """A log of two runs under OLD: reads, internal and external mail, charges."""
    log = tmp_path / "audit.jsonl"
    audit = audit if audit is not None else AuditLog(log, durability="flush")
    gate = Gate(Policy.from_string(OLD), audit=audit, tools=[lookup, send_email, charge])
    for principal in ("alice", "bob"):
        ctx = gate.start_run(principal=principal, labels={"env": "prod"})
        gate.call("lookup", {"order": "1"}, context=ctx)
        gate.call("send_email", {"to": "a@example.com", "body": "hi"}, context=ctx)
        with pytest.raises(ProctorError):
            gate.call("send_email", {"to": "x@elsewhere.org", "body": "hi"}, context=ctx)
        gate.call("charge", {"card": "4111111111111111", "amount": 5}, context=ctx)
        gate.call("lookup", {"order": "2"}, context=ctx)
        gate.finish_run(ctx)
    audit.close()
    return log


def test_same_policy_changes_nothing(tmp_path: Path) -> None:
    log = _record(tmp_path)
    report = replay_log(Policy.from_string(OLD), str(log))
    assert (report.decided, report.changed, report.undecidable, report.unchanged) == (10, 0, 0, 10)
    assert list(report.recorded_policies.values()) == [10]


def test_changes_are_grouped_by_change_and_rule(tmp_path: Path) -> None:
    log = _record(tmp_path)
    new = Policy.from_string(OLD.replace("endsWith('@example.com')", "endsWith('.org')")
                             .replace("{name: reads, match: {side_effect: read}, decision: allow}",
                                      "{name: reads, match: {side_effect: read}, decision: require_approval}"))
    report = replay_log(new, str(log))
    out = report.as_dict()
    assert out["by_change"]["allow→deny"]["count"] == 2  # internal mail: no rule matches now, default deny
    assert out["by_change"]["deny→allow"]["count"] == 2  # external mail
    assert out["by_change"]["allow→require_approval"]["count"] == 4  # the reads
    assert out["by_rule"]["reads"]["count"] == 4
    assert out["by_rule"]["mail"]["count"] == 4  # both mail changes involve the rule (old or new)
    example = out["by_change"]["deny→allow"]["examples"][0]
    assert example["tool"] == "send_email" and example["args"]["to"] == "x@elsewhere.org"
    assert example["new_rules"] == ["mail"] and example["old_rules"] == []


def test_a_condition_on_a_redacted_argument_is_undecidable(tmp_path: Path) -> None:
    log = _record(tmp_path)
    new = Policy.from_string(OLD.replace("{name: charges, match: {tool: charge}, decision: allow}",
                                         "{name: charges, match: {tool: charge}, decision: allow, "
                                         "when: \"args.card.startsWith('4')\"}"))
    report = replay_log(new, str(log))
    assert report.undecidable == 2 and report.changed == 0
    assert list(report.undecidable_why) == ["a condition reads a redacted argument"]
    # A condition on the clear argument of the same call is decided.
    clear = Policy.from_string(OLD.replace("{name: charges, match: {tool: charge}, decision: allow}",
                                           "{name: charges, match: {tool: charge}, decision: allow, "
                                           "when: 'args.amount > 10'}"))
    report = replay_log(clear, str(log))
    assert report.undecidable == 0 and report.by_change["allow→deny"].count == 2


def test_history_budgets_and_run_facts(tmp_path: Path) -> None:
    log = _record(tmp_path)
    new = Policy.from_string(OLD + """
  - name: no-mail-after-charge
    match: {tool: send_email}
    when: "history.exists(h, h.tool == 'charge')"
    decision: deny
  - name: bob-reads
    match: {tool: lookup}
    when: "run.principal == 'bob' && run.labels.env == 'prod'"
    decision: deny
budgets:
  - {name: one-lookup, match: {tool: lookup}, limit: {calls: 1}}
""")
    report = replay_log(new, str(log))
    out = report.as_dict()
    # bob's two reads are denied by the rule; alice's second read by the per-run budget.
    assert out["by_rule"]["bob-reads"]["count"] == 2
    assert out["by_rule"]["budget:one-lookup"]["count"] == 1
    budget_example = out["by_rule"]["budget:one-lookup"]["examples"][0]
    assert budget_example["budget"] == "one-lookup" and "exhausted" in budget_example["new_reason"]
    # No mail came after a charge in these runs: the history rule changes nothing.
    assert "no-mail-after-charge" not in out["by_rule"]


def test_a_log_without_a_runs_start_cannot_say_its_principal_earlier_calls_or_budgets(tmp_path: Path) -> None:
    """A log that begins mid-run (rotated, cut): the run's principal, labels, history and budgets are not in it,
    so a call whose decision reads them is undecidable, never decided as if the run had no principal."""
    whole = _record(tmp_path)
    cut = tmp_path / "cut.jsonl"
    lines = whole.read_text().splitlines()
    cut.write_text("".join(line + "\n" for line in lines if json.loads(line)["kind"] != "run_started"))
    bobs = Policy.from_string(OLD + """
  - name: bob-reads
    match: {tool: lookup}
    when: "run.principal == 'bob'"
    decision: deny
""")
    assert replay_log(bobs, str(whole)).changed == 2  # with the starts: bob's two reads change
    report = replay_log(bobs, str(cut))
    assert report.changed == 0 and report.undecidable == 4  # the four reads, whoever's run they were
    assert list(report.undecidable_why) == ["the log does not hold the run's start (run_started): its principal, "
                                            "labels, earlier calls and budgets are not known"]
    one_read = Policy.from_string(OLD + "budgets:\n  - {name: one-lookup, match: {tool: lookup}, limit: {calls: 1}}\n")
    assert replay_log(one_read, str(cut)).undecidable == 4  # how many reads came before is not known either
    # What depends on the call alone is still decided.
    plain = Policy.from_string(OLD.replace("endsWith('@example.com')", "endsWith('.org')"))
    report = replay_log(plain, str(cut))
    assert report.undecidable == 0 and report.changed == 4


def test_a_log_that_holds_a_run_from_its_resumption_only_cannot_say_its_earlier_calls_or_budgets(
        tmp_path: Path) -> None:
    """A durable run resumed by a process writing another log: that log has `run_resumed`, not `run_started`.
    The calls before the pause are in the first log, so a budget or a history over the run is not known."""
    from proctor.calls import RunInfo

    policy = Policy.from_string(OLD)
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    before = AuditLog(first, durability="flush")
    gate = Gate(policy, audit=before, tools=[lookup, send_email, charge])
    ctx = gate.start_run(principal="alice")
    gate.call("lookup", {"order": "1"}, context=ctx)
    gate.suspend_run(ctx, ["appr_1"])
    before.close()
    after = AuditLog(second, durability="flush")
    gate = Gate(policy, audit=after, tools=[lookup, send_email, charge])
    resumed = gate.resume_run(RunInfo(id=ctx.info.id, principal="alice", labels={}, step=1))
    gate.call("lookup", {"order": "2"}, context=resumed)
    gate.finish_run(resumed)
    after.close()
    one_read = Policy.from_string(OLD + "budgets:\n  - {name: one-lookup, match: {tool: lookup}, limit: {calls: 1}}\n")
    # The whole run (both logs, in order): the second read is the run's second, and the budget refuses it.
    joined = tmp_path / "joined.jsonl"
    joined.write_text(first.read_text() + second.read_text())
    assert replay_log(one_read, str(joined)).changed == 1
    # The second log alone cannot say how many reads came before: undecidable, not "allowed, unchanged".
    report = replay_log(one_read, str(second))
    assert report.decided == 0 and report.undecidable == 1
    assert "run_resumed" in next(iter(report.undecidable_why))
    # What depends on the call alone is still decided.
    assert replay_log(policy, str(second)).decided == 1


@tool(side_effect="destructive")
def wipe(path: str) -> str:
    """Wipe a path.

    Args:
        path: What to wipe.
    """
    return "wiped"


def test_a_class_the_recording_policy_gave_a_tool_is_not_taken_for_the_tools_own(tmp_path: Path) -> None:
    """The intent's `side_effect` is the class the recording policy gave the call (its `tools:` may override the
    tool's own). A new policy without that override decides by the tool's own class, as its gate would."""
    log = tmp_path / "audit.jsonl"
    audit = AuditLog(log, durability="flush")
    old = Policy.from_string("version: 1\ntools:\n  wipe: {side_effect: read}\n"
                             "rules:\n  - {name: reads, match: {side_effect: read}, decision: allow}\n")
    gate = Gate(old, audit=audit, tools=[wipe])
    ctx = gate.start_run()
    assert gate.call("wipe", {"path": "/tmp/x"}, context=ctx) == "wiped"
    gate.finish_run(ctx)
    audit.close()
    new = Policy.from_string("version: 1\nrules:\n  - {name: reads, match: {side_effect: read}, decision: allow}\n")
    with pytest.raises(ProctorError, match="no rule matched"):  # what a gate enforcing `new` does
        Gate(new, tools=[wipe]).call("wipe", {"path": "/tmp/x"})
    report = replay_log(new, str(log))
    assert report.changed == 1 and list(report.by_change) == ["allow→deny"]
    assert replay_log(old, str(log)).changed == 0


def test_a_record_with_a_huge_step_is_replayed_at_once(tmp_path: Path) -> None:
    """The log is not trusted: a step of 10**12 (an edited record) starts a new step, it does not make the replay
    count to it; a per-step budget still starts afresh there."""
    log = tmp_path / "audit.jsonl"
    records = [{"kind": "run_started", "run_id": "r", "principal": "alice"}] + [
        {"kind": kind, "run_id": "r", "call_id": f"c{i}", "tool": "lookup", "args": {"order": str(i)},
         "decision": "allow", "side_effect": "read", "step": step, "status": "ok"}
        for i, step in enumerate((1, 1, 10**12)) for kind in ("call_intent", "call_outcome")]
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    one_per_step = Policy.from_string(OLD + "budgets:\n  - {name: one, per: step, match: {tool: lookup}, "
                                            "limit: {calls: 1}}\n")
    report = replay_log(one_per_step, str(log))
    assert report.decided == 3 and report.changed == 1  # the second call of step 1; step 10**12 starts afresh
    assert report.by_rule["budget:one"].count == 1


def test_provenance_is_undecidable(tmp_path: Path) -> None:
    log = _record(tmp_path)
    new = Policy.from_string(OLD + """
  - name: no-untrusted-mail
    match: {tool: send_email}
    when: "'untrusted' in provenance(args.to)"
    decision: deny
""")
    report = replay_log(new, str(log))
    assert report.undecidable == 4
    assert "provenance" in next(iter(report.undecidable_why))


def test_cli_fail_on_change_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _record(tmp_path)
    same = tmp_path / "same.yaml"
    same.write_text(OLD)
    stricter = tmp_path / "new.yaml"
    stricter.write_text(OLD.replace("{name: charges, match: {tool: charge}, decision: allow}",
                                    "{name: charges, match: {tool: charge}, decision: deny}"))
    assert main(["policy", "replay", str(same), "--audit", str(log), "--fail-on-change"]) == 0
    capsys.readouterr()
    assert main(["policy", "replay", str(stricter), "--audit", str(log), "--fail-on-change", "--json"]) == 1
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert out["changed"] == 2 and out["by_change"]["allow→deny"]["count"] == 2
    assert main(["policy", "replay", str(stricter), "--audit", str(log)]) == 0  # reports, does not fail
    text = capsys.readouterr().out
    assert "allow→deny" in text and "charges" in text
    # --since in the future: nothing counted
    assert main(["policy", "replay", str(stricter), "--audit", str(log), "--since", "2999-01-01",
                 "--fail-on-change"]) == 0
    # A log with lines that are not records (cut, corrupted, edited) cannot say nothing changed: the calls in
    # those lines were not decided again. Without --fail-on-change it is reported, as before.
    torn = tmp_path / "torn.jsonl"
    lines = log.read_text().splitlines()
    charge_intents = [i for i, line in enumerate(lines) if '"tool":"charge"' in line.replace(" ", "")]
    torn.write_text("".join(line[:20] + "\n" if i in charge_intents else line + "\n" for i, line in enumerate(lines)))
    capsys.readouterr()
    assert main(["policy", "replay", str(stricter), "--audit", str(torn), "--fail-on-change"]) == 1
    assert "were not records and were skipped" in capsys.readouterr().out
    assert main(["policy", "replay", str(stricter), "--audit", str(torn)]) == 0


def test_cli_fail_on_undecidable_says_how_many_and_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A policy whose condition reads a redacted argument decides nothing of those calls: --fail-on-change alone
    passes (nothing it could decide changed), --fail-on-undecidable fails and says how many and why."""
    log = _record(tmp_path)
    on_card = tmp_path / "card.yaml"
    on_card.write_text(OLD.replace("{name: charges, match: {tool: charge}, decision: allow}",
                                   "{name: charges, match: {tool: charge}, decision: allow, "
                                   "when: \"args.card.startsWith('4')\"}"))
    why = "a condition reads a redacted argument"
    assert main(["policy", "replay", str(on_card), "--audit", str(log), "--fail-on-change"]) == 0
    captured = capsys.readouterr()
    assert "2 undecidable" in captured.out and captured.err == ""
    assert "undecidable: 2 recorded call(s) could not be decided again" in captured.out
    assert f"  2: {why}" in captured.out and "seq " in captured.out and " charge" in captured.out
    assert main(["policy", "replay", str(on_card), "--audit", str(log), "--fail-on-change",
                 "--fail-on-undecidable", "--json"]) == 1
    captured = capsys.readouterr()
    out: dict[str, Any] = json.loads(captured.out)
    assert out["undecidable"] == 2 and out["changed"] == 0
    group = out["undecidable_by_reason"][why]
    assert group["count"] == 2 and [ex["tool"] for ex in group["examples"]] == ["charge", "charge"]
    assert captured.err.strip() == (
        "proctor policy replay: 2 recorded call(s) could not be decided again, so this report says nothing of "
        f"what the policy would do to them (--fail-on-undecidable): 2: {why}")
    # The two flags fail each on its own: a changed decision under --fail-on-undecidable alone passes.
    stricter = tmp_path / "new.yaml"
    stricter.write_text(OLD.replace("{name: charges, match: {tool: charge}, decision: allow}",
                                    "{name: charges, match: {tool: charge}, decision: deny}"))
    assert main(["policy", "replay", str(stricter), "--audit", str(log), "--fail-on-undecidable"]) == 0
    assert main(["policy", "replay", str(stricter), "--audit", str(log), "--fail-on-change",
                 "--fail-on-undecidable"]) == 1
    assert "2 recorded decision(s) would change (--fail-on-change)" in capsys.readouterr().err
    # Lines that are not records held calls nobody decided again: --fail-on-undecidable fails on them too.
    torn = tmp_path / "torn.jsonl"
    torn.write_text(log.read_text() + "{not a record\n")
    assert main(["policy", "replay", str(stricter), "--audit", str(torn), "--fail-on-undecidable"]) == 1
    assert "line(s) of the log are not records" in capsys.readouterr().err


def test_coverage(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from proctor.policy.coverage import coverage_log

    log = _record(tmp_path)
    policy = Policy.from_string("""
version: 1
tools:
  lookup: {side_effect: read}
  charge: {side_effect: destructive, redact: [card]}
budgets:
  - {name: mails, match: {tool: send_email}, limit: {calls: 4}}
  - {name: charges, match: {tool: charge}, limit: {calls: 1}}
rules:
  - {name: reads, match: {side_effect: read}, decision: allow}
  - name: mail
    match: {tool: send_email}
    when: "args.to.endsWith('@example.com')"
    decision: allow
  - {name: wipes, match: {tool: wipe}, decision: deny}
  - {name: charges, match: {tool: charge}, decision: allow}
""")
    report = coverage_log(policy, str(log))
    assert report.calls == 10
    assert report.never_matched == ["wipes"]
    assert report.always_matched == ["reads", "charges"]
    assert report.rules["mail"] == [4, 2]
    assert report.budgets["charges"].max_fraction == 1.0  # one of one used in each run
    assert report.budgets["mails"].max_fraction == 0.25  # only internal mail is allowed (and reserves)
    assert sorted(report.undeclared) == ["send_email"]
    p = tmp_path / "p.yaml"
    p.write_text("version: 1\nrules:\n  - {name: everything, decision: allow}\n")
    assert main(["policy", "coverage", str(p), "--audit", str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["always_matched"] == ["everything"] and out["undeclared_tools"] == ["charge", "lookup", "send_email"]
    assert main(["policy", "coverage", str(p), "--audit", str(log)]) == 0
    text = capsys.readouterr().out
    assert "rules that never matched: 0" in text
    assert "tools called but not declared in `tools`: 3\n  charge\n  lookup\n  send_email" in text


def test_replay_from_a_postgres_audit_log(tmp_path: Path, postgres_server: PostgresServer,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from proctor.audit.postgres import PostgresAuditLog

    url = f"{postgres_server.url}&log=replay_{tmp_path.name[-8:]}"
    _record(tmp_path, PostgresAuditLog(url))
    stricter = tmp_path / "new.yaml"
    stricter.write_text(OLD.replace("{name: charges, match: {tool: charge}, decision: allow}",
                                    "{name: charges, match: {tool: charge}, decision: deny}"))
    assert main(["policy", "replay", str(stricter), "--audit", url, "--json", "--fail-on-change"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["decided"] == 10 and out["by_change"]["allow→deny"]["count"] == 2


def test_history_is_rebuilt_as_the_call_had_it(tmp_path: Path) -> None:
    log = _record(tmp_path)
    # Mail after a charge: the second lookup of each run comes after the charge, the mails before it.
    after_charge = Policy.from_string(OLD + """
  - name: nothing-after-charge
    match: {tool: lookup}
    when: "history.exists(h, h.tool == 'charge' && h.status == 'ok')"
    decision: deny
""")
    out = replay_log(after_charge, str(log)).as_dict()
    assert out["by_rule"]["nothing-after-charge"]["count"] == 2
    assert {ex["args"]["order"] for ex in out["by_rule"]["nothing-after-charge"]["examples"]} == {"2"}
    # A condition reading an earlier call's arguments, when one of them was redacted: undecidable.
    reads_args = Policy.from_string(OLD + """
  - name: no-repeat
    match: {tool: lookup}
    when: "history.exists(h, h.args == args)"
    decision: deny
""")
    report = replay_log(reads_args, str(log))
    # the first lookup of each run comes before the charge (no redacted entry yet): decided
    assert report.undecidable == 2 and report.decided == 8
    assert "earlier call's arguments" in next(iter(report.undecidable_why))


def test_since_counts_later_calls_only(tmp_path: Path) -> None:
    from proctor.audit.lines import read_records

    log = _record(tmp_path)
    records, _ = read_records(log)
    second_run = next(r for r in records if r["kind"] == "run_started" and r["principal"] == "bob")
    report = replay_log(Policy.from_string(OLD), str(log), since_ns=second_run["ts_ns"])
    assert report.decided == 5  # bob's run only


def test_without_conditions_an_expression_on_a_redacted_argument_or_an_unknown_cost_is_still_undecidable(
        tmp_path: Path) -> None:
    """Calls of rules without conditions skip the redaction look-up only when nothing else could read the
    arguments: a side_effect or cost expression over a redacted one, or a cost the log does not hold."""
    log = _record(tmp_path)
    expression = Policy.from_string(OLD.replace(
        "charge: {side_effect: destructive, redact: [card]}",
        "charge: {side_effect: \"args.card.startsWith('4') ? 'destructive' : 'write'\", redact: [card]}"))
    report = replay_log(expression, str(log))
    assert report.undecidable == 2
    assert list(report.undecidable_why) == ["the tool's side_effect or cost expression reads a redacted argument"]
    cost = Policy.from_string(OLD + "budgets:\n  - {name: spend, match: {tool: charge}, limit: {cost: 100}}\n")
    report = replay_log(cost, str(log))
    assert report.undecidable == 2
    assert list(report.undecidable_why) == [
        "a cost budget counts this tool and the policy declares no cost for it (not in the log)"]
    assert (report.decided, report.changed) == (8, 0)  # the rest, rules without conditions, decided as before


def test_a_line_over_the_limit_is_skipped_and_counted(tmp_path: Path) -> None:
    """A line longer than the log's line limit in the middle of a log is counted as a bad line (never read
    whole) and the records around it are replayed as without it."""
    from proctor.audit.lines import MAX_LINE_BYTES

    log = _record(tmp_path)
    lines = log.read_bytes().splitlines(keepends=True)
    half = len(lines) // 2
    log.write_bytes(b"".join(lines[:half]) + b"x" * (MAX_LINE_BYTES + 10) + b"\n" + b"".join(lines[half:]))
    report = replay_log(Policy.from_string(OLD), str(log))
    assert report.bad_lines == 1
    assert (report.decided, report.changed, report.undecidable) == (10, 0, 0)


def test_every_change_is_counted_and_each_group_keeps_its_first_examples(tmp_path: Path) -> None:
    """With more changes than a group keeps examples of, every change is counted in its group and in each of
    its rules', and the examples are the first changes of the log, in order."""
    from proctor.policy.replay import EXAMPLES_PER_GROUP

    log = tmp_path / "audit.jsonl"
    audit = AuditLog(log, durability="flush")
    gate = Gate(Policy.from_string(OLD), audit=audit, tools=[lookup, send_email, charge])
    ctx = gate.start_run(principal="alice")
    for order in range(EXAMPLES_PER_GROUP + 4):
        gate.call("lookup", {"order": str(order)}, context=ctx)
    gate.finish_run(ctx)
    audit.close()
    new = Policy.from_string(OLD.replace("{name: reads, match: {side_effect: read}, decision: allow}",
                                         "{name: reads, match: {side_effect: read}, decision: deny}"))
    out = replay_log(new, str(log)).as_dict()
    assert out["changed"] == EXAMPLES_PER_GROUP + 4
    for group in (out["by_change"]["allow→deny"], out["by_rule"]["reads"]):
        assert group["count"] == EXAMPLES_PER_GROUP + 4
        assert [e["args"]["order"] for e in group["examples"]] == [str(i) for i in range(EXAMPLES_PER_GROUP)]


def _tampered(tmp_path: Path, log: Path) -> dict[str, Path]:
    """The log three ways an editor hides a call: a charge's decision edited, its intents deleted, two records
    swapped. Every line is still a record: only the chain says what happened."""
    lines = log.read_text().splitlines(keepends=True)
    charges = [i for i, line in enumerate(lines) if '"kind":"call_intent"' in line and '"tool":"charge"' in line]
    out = {"edited": tmp_path / "edited.jsonl", "deleted": tmp_path / "deleted.jsonl",
           "swapped": tmp_path / "swapped.jsonl"}
    out["edited"].write_text("".join(line.replace('"decision":"allow"', '"decision":"deny"') if i in charges
                                     else line for i, line in enumerate(lines)))
    out["deleted"].write_text("".join(line for i, line in enumerate(lines) if i not in charges))
    swapped = list(lines)
    swapped[3], swapped[4] = swapped[4], swapped[3]
    out["swapped"].write_text("".join(swapped))
    return out


def test_a_log_whose_hash_chain_is_broken_is_said_to_be_and_never_passes_the_gate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = _record(tmp_path)
    stricter = tmp_path / "new.yaml"
    stricter.write_text(OLD.replace("{name: charges, match: {tool: charge}, decision: allow}",
                                    "{name: charges, match: {tool: charge}, decision: deny}"))
    intact = replay_log(Policy.from_yaml(stricter), str(log))
    assert intact.log_intact is True and intact.log_failure is None
    for how, path in _tampered(tmp_path, log).items():
        report = replay_log(Policy.from_yaml(stricter), str(path))
        assert report.log_intact is False, how
        assert report.log_failure is not None and "seq" in report.log_failure, how
        # The edit hides the change the new policy makes: a replay that read the log as written says nothing
        # changed, so only the chain keeps a policy pull request from passing on a doctored log.
        capsys.readouterr()
        assert main(["policy", "replay", str(stricter), "--audit", str(path), "--fail-on-change"]) == 1, how
        text = capsys.readouterr().out
        assert "NOT INTACT" in text and "proctor audit verify" in text, how
        assert main(["policy", "replay", str(stricter), "--audit", str(path), "--json"]) == 0, how
        out: dict[str, Any] = json.loads(capsys.readouterr().out)
        assert out["log_intact"] is False and out["log_failure"] == report.log_failure, how
        assert main(["policy", "coverage", str(stricter), "--audit", str(path), "--json"]) == 0, how
        cov: dict[str, Any] = json.loads(capsys.readouterr().out)
        assert cov["log_intact"] is False and cov["log_failure"] == report.log_failure, how
        assert main(["policy", "coverage", str(stricter), "--audit", str(path)]) == 0, how
        assert "NOT INTACT" in capsys.readouterr().out, how
    assert main(["policy", "replay", str(stricter), "--audit", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["log_intact"] is True


def test_pubkey_pins_who_may_have_written_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A chain can be rewritten whole from an edit on, and signed again with a key of the editor's own: only the
    key the log's writer holds tells. `--pubkey` checks the checkpoints against it, as `audit verify` does."""
    from proctor.audit import generate_keypair

    writer, _, _ = generate_keypair(tmp_path / "writer.key")
    other, _, _ = generate_keypair(tmp_path / "other.key")
    log = _record(tmp_path, AuditLog(tmp_path / "audit.jsonl", durability="flush", signing_key=writer))
    policy = tmp_path / "same.yaml"
    policy.write_text(OLD)
    assert main(["policy", "replay", str(policy), "--audit", str(log), "--pubkey", f"{writer}.pub", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["log_intact"] is True
    assert main(["policy", "replay", str(policy), "--audit", str(log), "--pubkey", f"{other}.pub",
                 "--fail-on-change"]) == 1
    assert "NOT INTACT" in capsys.readouterr().out
    assert main(["policy", "coverage", str(policy), "--audit", str(log), "--pubkey", f"{other}.pub", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["log_intact"] is False
    assert replay_log(Policy.from_string(OLD), str(log), pubkey=f"{other}.pub").log_intact is False
