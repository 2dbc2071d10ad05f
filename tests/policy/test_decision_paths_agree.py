"""Every path that decides a call agrees with the live gate, from the outside.

A real `Gate` with a real audit log decides a run's calls; beside it, for every call:

- `decide_like_gate` (what `policy test` and `policy explain` run) on the run as the gate had it
  (the calls before it, `seen`, budgets' usage) must reach the gate's verdict;
- an identical shadow policy must never write a `shadow_decision`;
- `policy replay` of the gate's own log under the same policy must find every call unchanged or
  undecidable, never changed.

(The sibling tests/policy/test_policy_gate_parity.py runs the example policies' cases files the
same way through the gate and `policy test`.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiers import examples

from proctor.approval import ApprovalDecision, ApprovalRequest, CallbackApprover
from proctor.audit import AuditLog
from proctor.calls import Call, HistoryEntry, RunInfo
from proctor.canonical import canonical_bytes, untagged
from proctor.errors import ToolDenied
from proctor.gate import Gate, RunContext
from proctor.ledger.memory import MemoryLedger
from proctor.narrowing import Layer, StackedLedger
from proctor.policy import Policy
from proctor.policy.replay import ReplayReport, replay_log
from proctor.policy.simulate import decide_like_gate
from proctor.tools import Tool, as_tool, tool


@tool(side_effect="read")
def look(q: str, n: int = 1) -> str:
    """Look something up.

    Args:
        q: What to look for.
        n: How many results.
    """
    return f"found {q}"


@tool(side_effect="external", cost=2)
def send(to: str, body: str = "", amount: float = 0.0) -> str:
    """Send a message, with money.

    Args:
        to: Recipient.
        body: Text.
        amount: Money sent along.
    """
    return f"sent to {to}"


@tool(side_effect="write")
def put(key: str, value: dict[str, Any] | None = None, blob: bytes = b"") -> str:
    """Store a value.

    Args:
        key: Where.
        value: What.
        blob: Raw bytes kept beside it.
    """
    return f"stored {key}"


@tool(side_effect="external")
def post(to: str, n: int = 0) -> str:
    """Post n items.

    Args:
        to: Where.
        n: How many.
    """
    return f"posted {n}"


TOOLS: dict[str, Tool] = {t.name: t for t in map(as_tool, (look, send, put, post))}

#: A policy reaching into most corners: expressions for class and cost over the arguments, labels and
#: `seen`, history (filter, map, size, last, an index), `usage`, run facts, a condition that raises,
#: per-run, per-step, per-principal and global budgets.
RICH: dict[str, Any] = {
    "version": 1,
    "default": "require_approval",
    "ledger": "local",
    "tools": {
        "look": {"labels": ["untrusted"]},
        "send": {"cost": "args.amount"},
        "put": {"side_effect": "args.key.startsWith('tmp') ? 'write' : 'destructive'"},
        "post": {"cost": "args.n - 1"},
    },
    "budgets": [
        {"name": "money", "match": {"tool": "send"}, "limit": {"cost": 100, "calls": 6}},
        {"name": "posts", "per": "principal", "match": {"tool": "post"}, "limit": {"cost": 12}},
        {"name": "looks", "per": "global", "match": {"tool": "look"}, "limit": {"calls": 9}},
        {"name": "step", "per": "step", "limit": {"calls": 40}},
    ],
    "rules": [
        {"name": "reads", "match": {"side_effect": "read"}, "decision": "allow"},
        {"name": "bad-look", "match": {"tool": "look"}, "when": "args.q == 'x' && history.size() > 2",
         "decision": "deny"},
        {"name": "first-was-x", "match": {"tool": "look"},
         "when": "history.size() > 0 && history[0].tool == 'look' && history[0].args.q == 'x'",
         "decision": "require_approval"},
        {"name": "small", "match": {"tool": "send"}, "when": "args.amount < 50.0", "decision": "allow"},
        {"name": "tainted", "match": {"tool": "send"}, "when": "'untrusted' in seen && args.amount > 5.0",
         "decision": "deny"},
        {"name": "repeat", "match": {"tool": "send"},
         "when": "history.filter(c, c.tool == 'send' && c.status == 'ok').size() >= 2",
         "decision": "require_approval"},
        {"name": "spent", "match": {"tool": "send"}, "when": "usage.money.cost > 40.0", "decision": "deny"},
        {"name": "tmp", "match": {"tool": "put", "side_effect": "write"}, "decision": "allow"},
        {"name": "blob", "match": {"tool": "put"}, "when": "size(args.blob) > 2", "decision": "deny"},
        {"name": "after-bad", "match": {"tool": ["send", "post"]},
         "when": "history.last(2).exists(c, c.tool == 'look' && c.args.q == 'bad')", "decision": "deny"},
        {"name": "divides", "match": {"tool": "post"}, "when": "100 / (args.n - 2) > 1", "decision": "allow"},
        {"name": "prod", "match": {"tool": "post"},
         "when": "'env' in run.labels && run.labels.env == 'prod' && run.principal != 'ops'",
         "decision": "require_approval"},
        {"name": "many-posts", "match": {"tool": "post"},
         "when": "history.map(c, c.tool).filter(t, t == 'post').size() >= 3", "decision": "deny"},
    ],
}


Answer = Callable[[ApprovalRequest], "bool | ApprovalDecision"]


@dataclass
class Agreement:
    """What one scripted session showed: each call's verdict by the gate and by `decide_like_gate`,
    the shadow's records, and the replay of the gate's log under the same policy."""

    verdicts: list[tuple[str, Mapping[str, Any], tuple[str, str | None], tuple[str, str | None]]] = field(
        default_factory=list)
    shadow_decisions: list[dict[str, Any]] = field(default_factory=list)
    report: ReplayReport | None = None
    records: list[dict[str, Any]] = field(default_factory=list)

    def assert_agree(self) -> None:
        for name, args, gate, simulated in self.verdicts:
            assert gate == simulated, (name, dict(args), gate, simulated)
        assert self.shadow_decisions == [], self.shadow_decisions
        assert self.report is not None
        changes = {k: [(c.seq, c.args, c.old_rules, c.new_rules, c.new_reason) for c in g.examples]
                   for k, g in self.report.by_change.items()}
        assert self.report.changed == 0, changes


def _verdict(outcome: Any, asked: Sequence[ApprovalRequest]) -> tuple[str, str | None]:
    """The gate's verdict on a call before any human: (outcome, budget that refused it)."""
    record = outcome.record
    if asked:
        return "require_approval", None
    if record.status == "ok":
        return "allow", None
    return "deny", record.budget


def _simulated(policy: Policy, name: str, args: Mapping[str, Any], history: Sequence[HistoryEntry],
               ctx: RunContext, usage: Mapping[str, Mapping[str, float]]) -> tuple[str, str | None]:
    sim = decide_like_gate(policy, Call(tool=name, args=args, history=tuple(history), run=ctx.info,
                                        seen=ctx.seen_labels(), provenance=ctx.provenance), TOOLS, usage=usage)
    return sim.decision.outcome, sim.budget


Script = Sequence[tuple[str | None, Mapping[str, str], Sequence[tuple[str, Mapping[str, Any]]]]]


def run_script(tmp: Path, spec: Mapping[str, Any], runs: Script, *, answer: Answer | None = None,
               history_limit: int = 1000) -> Agreement:
    """Each run (principal, labels, calls) through one real gate with an identical shadow, then replay its log.

    The first run's calls are decided with `decide_like_gate` too (the later runs' budgets wider than a
    run were charged by earlier runs, which `policy test` starts from the run's `usage` only)."""
    policy = Policy.from_dict(json.loads(json.dumps(spec)))
    path = tmp / f"audit-{len(list(tmp.iterdir()))}.jsonl"
    log = AuditLog(path)
    asked: list[ApprovalRequest] = []

    def approver(request: ApprovalRequest) -> bool | ApprovalDecision:
        asked.append(request)
        return answer(request) if answer is not None else True

    gate = Gate(policy, audit=log, tools=TOOLS.values(), shadow=Policy.from_dict(json.loads(json.dumps(spec))),
                approver=CallbackApprover(approver), history_limit=history_limit, ledger=MemoryLedger())
    out = Agreement()
    for i, (principal, labels, calls) in enumerate(runs):
        ctx = gate.start_run(principal=principal, labels=dict(labels))
        history: list[HistoryEntry] = []  # the whole run, as `policy test` is given it
        for name, args in calls:
            expected = (_simulated(policy, name, args, history, ctx, ctx.ledger.usage())
                        if i == 0 else None)
            before = len(asked)
            outcome = gate.submit(name, args, context=ctx)
            got = _verdict(outcome, asked[before:])
            if expected is not None:
                out.verdicts.append((name, args, got, expected))
            history.append(tuple(ctx.history_view())[-1])
        gate.finish_run(ctx)
    log.close()
    out.records = [json.loads(line) for line in path.read_text().splitlines()]
    out.shadow_decisions = [r for r in out.records if r["kind"] == "shadow_decision"]
    out.report = replay_log(policy, str(path))
    return out


LOOKS = [("look", {"q": "a"}), ("look", {"q": "bad"}), ("look", {"q": "x"}), ("look", {"q": "y", "n": 3})]
SENDS = [("send", {"to": "a", "amount": 1.5}), ("send", {"to": "b", "amount": 60.0}),
         ("send", {"to": "c", "amount": 45.0, "body": "hi"}), ("send", {"to": "d", "amount": 3}),
         ("send", {"to": "e"})]
PUTS = [("put", {"key": "tmp1"}), ("put", {"key": "etc", "value": {"a": [1, 2.5]}}),
        ("put", {"key": "tmp2", "blob": b"abcdef"}), ("put", {"key": 7})]
POSTS = [("post", {"to": "a", "n": 2}), ("post", {"to": "a", "n": 0}), ("post", {"to": "a", "n": 5}),
         ("post", {"to": "a", "n": 3})]
#: An unknown tool, and a look-alike of `look` (fullwidth letters, NFKC-equal to it): both refused as unknown.
CALLS = LOOKS + SENDS + PUTS + POSTS + [("nope", {}), ("\uff4c\uff4f\uff4f\uff4b", {"q": "a"})]


def test_a_scripted_run_agrees_on_every_path(tmp_path: Path) -> None:
    """Every kind of call of the rich policy, in an order that reaches its history and budget rules."""
    calls = [LOOKS[0], SENDS[0], SENDS[1], SENDS[3], LOOKS[1], POSTS[0], SENDS[2], POSTS[1], POSTS[2], PUTS[0],
             PUTS[1], PUTS[2], PUTS[3], LOOKS[2], SENDS[4], POSTS[3], POSTS[2], ("nope", {}), LOOKS[3]]
    for history_limit in (1000, 2):
        got = run_script(tmp_path, RICH, [(None, {}, calls), ("eve", {"env": "prod"}, calls),
                                          ("ops", {"env": "prod"}, calls)], history_limit=history_limit)
        got.assert_agree()
        assert {v[2][0] for v in got.verdicts} == {"allow", "deny", "require_approval"}
        assert got.report is not None and got.report.decided > 0


def test_float_and_bytes_arguments_replay_as_the_gate_decided_them(tmp_path: Path) -> None:
    """The log keeps a float as {"$float": "1.5"} and bytes as {"$bytes": …}: replay reads them back as the
    values the gate's conditions and `cost:` expression saw, not as maps a condition cannot compare."""
    calls = [SENDS[0], SENDS[1], SENDS[2], PUTS[2], ("put", {"key": "tmp3", "blob": b"a"})]
    got = run_script(tmp_path, RICH, [(None, {}, calls)])
    got.assert_agree()
    intents = [r for r in got.records if r["kind"] == "call_intent"]
    assert intents[0]["args"]["amount"] == {"$float": "1.5"}  # the log's form, which replay must read back
    assert got.report is not None and got.report.decided == len(calls)


def test_untagged_reads_back_what_canonical_json_tags() -> None:
    value = {"a": 1.5, "b": [b"\x00\xff", {"c": -0.0}], "d": "$float", "e": {"$float": "1.50"},
             "f": {"$bytes": "not base64!"}, "g": {"$float": "2.0", "x": 1}}
    back = untagged(json.loads(canonical_bytes(value)))
    assert back == {"a": 1.5, "b": [b"\x00\xff", {"c": -0.0}], "d": "$float", "e": {"$float": "1.50"},
                    "f": {"$bytes": "not base64!"}, "g": {"$float": "2.0", "x": 1}}
    plain = {"q": "a", "n": [1, {"m": "x"}]}
    assert untagged(plain) is plain


def test_a_call_refused_because_its_cost_cannot_be_computed_replays_unchanged(tmp_path: Path) -> None:
    """`cost: args.n - 1` is negative for n=0: the gate refuses the call whatever its rules decided (here
    require_approval, by `prod`); the intent says so (`refused_at: cost`) and replay compares it as denied."""
    got = run_script(tmp_path, RICH, [("eve", {"env": "prod"}, [POSTS[1], POSTS[2]])])
    got.assert_agree()
    intent = next(r for r in got.records if r["kind"] == "call_intent")
    assert (intent["decision"], intent.get("refused_at")) == ("require_approval", "cost")
    assert got.verdicts[0][2] == ("deny", None)


def test_an_approvers_edit_is_decided_as_a_fresh_call_of_those_arguments(tmp_path: Path) -> None:
    """An edit is admitted again with the original call's budget hold given back first: a `usage` condition
    sees what a fresh call of the edited arguments would (not the call itself counted), and so do
    `policy test`, the shadow and replay."""
    spec = {"version": 1, "default": "allow", "tools": {"post": {"cost": "args.n"}},
            "budgets": [{"name": "posts", "match": {"tool": "post"}, "limit": {"calls": 5, "cost": 10}}],
            "rules": [{"name": "ask", "match": {"tool": "post"}, "when": "args.to == 'ext'",
                       "decision": "require_approval"},
                      {"name": "busy", "match": {"tool": "post"}, "when": "usage.posts.calls >= 2",
                       "decision": "require_approval"}]}
    policy = Policy.from_dict(spec)
    edited = {"to": "int", "n": 1}

    def answer(request: ApprovalRequest) -> bool | ApprovalDecision:
        if request.args.get("n") == 7:
            return ApprovalDecision("edit", request.binding, "editor", "edited", args=edited)
        return True

    got = run_script(tmp_path, spec, [("a", {}, [("post", {"to": "int", "n": 3}), ("post", {"to": "ext", "n": 7}),
                                                 ("post", {"to": "int", "n": 2})])], answer=answer)
    got.assert_agree()
    intents = [r for r in got.records if r["kind"] == "call_intent"]
    # One call had run (usage.posts.calls == 1): the edited call is allowed, as a fresh one would be.
    assert intents[1]["args"] == edited and intents[1]["decision"] == "allow", intents[1]
    fresh = decide_like_gate(policy, Call(tool="post", args=edited, run=RunInfo(id="run_x", principal="a")),
                             TOOLS, usage={"posts": {"calls": 1, "cost": 3}})
    assert fresh.decision.outcome == "allow"
    assert intents[2]["decision"] == "require_approval" and intents[2]["rules"] == ["busy"]


def test_an_identical_shadow_keeps_its_pools_across_the_gates_runs(tmp_path: Path) -> None:
    """A global and a per-principal budget exhausted in the first run refuse the next runs' calls: the
    identical shadow's own pools, kept for all the gate's runs, refuse them alike."""
    calls = [POSTS[2], POSTS[3], POSTS[2], LOOKS[0], LOOKS[3], LOOKS[0], LOOKS[0]]
    got = run_script(tmp_path, RICH, [("a", {}, calls), ("a", {}, calls), ("b", {}, calls), ("a", {}, calls)])
    got.assert_agree()
    refused = {r.get("budget") for r in got.records if r["kind"] == "budget_exhausted"}
    assert {"posts", "looks"} <= refused


def test_an_identical_shadow_counts_an_edited_call_as_edited(tmp_path: Path) -> None:
    """The shadow's budgets are fed with the call that went on: an edit's arguments and cost."""
    spec = {"version": 1, "default": "allow", "ledger": "local", "tools": {"post": {"cost": "args.n"}},
            "budgets": [{"name": "pp", "per": "principal", "match": {"tool": "post"}, "limit": {"cost": 10}},
                        {"name": "g", "per": "global", "match": {"tool": "post"}, "limit": {"calls": 4}}],
            "rules": [{"name": "ask", "match": {"tool": "post"}, "when": "args.to == 'ext'",
                       "decision": "require_approval"}]}

    def answer(request: ApprovalRequest) -> bool | ApprovalDecision:
        if request.args.get("n") == 7:
            return ApprovalDecision("edit", request.binding, "editor", "edited", args={"to": "int", "n": 1})
        return True

    calls = [("post", {"to": "int", "n": 3}), ("post", {"to": "ext", "n": 7}), ("post", {"to": "int", "n": 5})]
    got = run_script(tmp_path, spec, [("a", {}, calls), ("a", {}, calls)], answer=answer)
    got.assert_agree()


def test_a_managed_agents_narrowed_call_is_undecidable_in_replay(tmp_path: Path) -> None:
    """A managed agent's own policy narrowed the call (denied it here): the log names that policy by
    fingerprint only, so replay counts the call undecidable instead of deciding it by the run's policy alone."""
    run_policy = Policy.from_dict({"version": 1, "default": "allow", "rules": []})
    own_policy = Policy.from_dict({"version": 1, "default": "allow",
                                   "rules": [{"name": "no-looks", "match": {"tool": "look"}, "decision": "deny"}]})
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    gate = Gate(run_policy, audit=log, tools=TOOLS.values(), shadow=Policy.from_dict({"version": 1,
                "default": "allow", "rules": []}), ledger=MemoryLedger())
    ctx = gate.start_run()
    own = Layer("sub", own_policy, own_policy.new_ledger(replace(ctx.info, step=0, agent="sub"), gate.ledger))
    sub = ctx.delegate("sub", ledger=StackedLedger(ctx.ledger, own.ledger, agent="sub"), tools=gate.tools,
                       layer=own, parent_call_id="call_parent")
    assert gate.submit("look", {"q": "a"}, context=sub).record.status == "denied"
    assert gate.submit("look", {"q": "a"}, context=ctx).record.status == "ok"
    gate.finish_run(ctx)
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    intent = next(r for r in records if r["kind"] == "call_intent")
    assert intent["layers"] == [{"agent": "sub", "policy_sha256": own_policy.sha256}]
    assert not [r for r in records if r["kind"] == "shadow_decision"]
    report = replay_log(run_policy, str(path))
    assert (report.changed, report.undecidable, report.unchanged) == (0, 1, 1), report.as_dict()
    assert "managed agent's own policy" in next(iter(report.undecidable_why))


def test_redacted_arguments_are_undecidable_never_guessed(tmp_path: Path) -> None:
    """A condition (or expression) reading a redacted field, of the call or of an earlier call through
    history: undecidable; one reading other fields: decided, unchanged."""
    spec = json.loads(json.dumps(RICH))
    spec["tools"]["send"]["redact"] = ["body"]
    spec["tools"]["put"]["redact"] = ["key"]
    spec["rules"].append({"name": "no-secret", "match": {"tool": "send"}, "when": "args.body.contains('s3cret')",
                          "decision": "deny"})
    calls = [LOOKS[0], SENDS[2], ("send", {"to": "z", "body": "s3cret"}), PUTS[0], PUTS[1], POSTS[0]]
    got = run_script(tmp_path, spec, [(None, {}, calls)])
    got.assert_agree()
    assert got.report is not None
    assert got.report.undecidable >= 4  # both sends (body), both puts (their class reads the key)
    assert not any("$redacted" in json.dumps(c) for g in got.report.by_change.values() for c in g.examples)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=st.lists(st.tuples(st.sampled_from([None, "eve", "ops"]),
                               st.sampled_from([{}, {"env": "prod"}, {"env": "dev"}]),
                               st.lists(st.sampled_from(CALLS), max_size=14)), min_size=1, max_size=3),
       history_limit=st.sampled_from([1000, 3]), edit=st.booleans())
def test_any_sequence_of_calls_agrees_on_every_path(tmp_path: Path, runs: list[tuple[Any, Any, Any]],
                                                    history_limit: int, edit: bool) -> None:
    """Random runs of the rich policy's calls (humans approving, or editing the arguments they are shown
    into another call's): the gate, `policy test`, an identical shadow and replay of the log agree."""
    sends = [args for name, args in CALLS if name == "send"]

    def answer(request: ApprovalRequest) -> bool | ApprovalDecision:
        if edit and request.tool == "send":
            other = sends[len(request.args.get("to", "")) % len(sends)]
            return ApprovalDecision("edit", request.binding, "editor", "edited", args=dict(other))
        return True

    run_script(tmp_path, RICH, runs, answer=answer, history_limit=history_limit).assert_agree()


def test_a_call_to_a_tool_the_gate_does_not_hold_is_rebuilt_as_the_gate_kept_it(tmp_path: Path) -> None:
    """The policy declares a class and labels for `nope`, which the gate does not hold: the gate refuses the
    call and keeps it in the run as the unknown worst case (destructive, no labels); the intent says so
    (`refused_at: tool`) and replay rebuilds the run's history alike, so a history rule reads the same."""
    spec = {"version": 1, "default": "allow", "tools": {"nope": {"side_effect": "read", "labels": ["lab"]}},
            "rules": [{"name": "after-destructive", "match": {"tool": "look"},
                       "when": "history.exists(c, c.side_effect == 'destructive')", "decision": "deny"}]}
    got = run_script(tmp_path, spec, [(None, {}, [("nope", {"a": 1}), ("look", {"q": "a"})])])
    got.assert_agree()
    assert [v[2][0] for v in got.verdicts] == ["deny", "deny"]
    intent = next(r for r in got.records if r["kind"] == "call_intent")
    assert intent.get("refused_at") == "tool"
    assert got.report is not None and (got.report.not_decided, got.report.unchanged) == (1, 1)

    # A call refused unread (over a size limit) to a tool the gate does not hold: the same.
    policy = Policy.from_dict(spec)
    path = tmp_path / "unread.jsonl"
    log = AuditLog(path)
    gate = Gate(policy, audit=log, tools=TOOLS.values(), ledger=MemoryLedger())
    ctx = gate.start_run()
    gate.refuse("nope", "nope: refused: its arguments are over the limit", context=ctx, args_bytes=10**7)
    assert gate.submit("look", {"q": "a"}, context=ctx).record.status == "denied"
    gate.finish_run(ctx)
    log.close()
    report = replay_log(policy, str(path))
    assert (report.changed, report.not_decided, report.unchanged) == (0, 1, 1), report.as_dict()


def test_deeply_nested_arguments_replay_without_a_recursion_error(tmp_path: Path) -> None:
    """Arguments nested hundreds deep (a float at the bottom) pass the gate; replay reads their record back —
    redaction marks looked for, tags undone — at any depth the log's reader takes, and agrees."""
    value: dict[str, Any] = {"x": 1.5}
    for _ in range(600):
        value = {"a": value}
    spec = {"version": 1, "default": "allow", "tools": {"put": {"side_effect": "write"}},
            "rules": [{"name": "nested", "match": {"tool": "put"}, "when": "has(args.value.a)", "decision": "deny"}]}
    got = run_script(tmp_path, spec, [(None, {}, [("put", {"key": "k", "value": value}), LOOKS[0]])])
    got.assert_agree()
    assert [v[2][0] for v in got.verdicts] == ["deny", "allow"]
    assert got.report is not None and (got.report.decided, got.report.bad_lines) == (2, 0)
    deep: Any = [{"$float": "1.5"}]  # as canonical JSON writes [[…[1.5]…]]
    for _ in range(5000):
        deep = [deep]
    back = untagged({"v": deep})
    for _ in range(5002):
        back = back["v"] if isinstance(back, dict) else back[0]
    assert back == 1.5


def _shadowed(tmp: Path, spec: Mapping[str, Any]) -> tuple[Gate, RunContext, Path, AuditLog]:
    path = tmp / "audit.jsonl"
    log = AuditLog(path)
    gate = Gate(Policy.from_dict(dict(spec)), audit=log, tools=TOOLS.values(), shadow=Policy.from_dict(dict(spec)),
                ledger=MemoryLedger(), approver=CallbackApprover(lambda request: True))
    return gate, gate.start_run(), path, log


def _disagreements(spec: Mapping[str, Any], gate: Gate, ctx: RunContext, path: Path, log: AuditLog
                   ) -> list[dict[str, Any]]:
    """The shadow's records of the run (ended now); replay of its log under the same policy changes nothing."""
    gate.finish_run(ctx)
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert replay_log(Policy.from_dict(json.loads(json.dumps(spec))), str(path)).changed == 0
    return [r for r in records if r["kind"] == "shadow_decision"]


def test_an_identical_shadow_starts_per_step_budgets_afresh_with_each_step(tmp_path: Path) -> None:
    """`per: step` budgets start again at each step of the run, in the shadow's ledger as in the run's."""
    spec = {"version": 1, "default": "allow",
            "budgets": [{"name": "per-step", "per": "step", "match": {"tool": "look"}, "limit": {"calls": 2}}],
            "rules": [{"name": "second", "match": {"tool": "look"}, "when": "usage['per-step'].calls >= 1",
                       "decision": "require_approval"}]}
    gate, ctx, path, log = _shadowed(tmp_path, spec)
    statuses = []
    for _ in range(3):
        statuses += [gate.submit("look", {"q": "a"}, context=ctx).record.status for _ in range(3)]
        ctx.next_step()
        ctx.next_step()  # a step without calls: still one fresh start
    assert statuses == ["ok", "ok", "denied"] * 3
    assert _disagreements(spec, gate, ctx, path, log) == []


def test_an_identical_shadow_counts_wall_time_from_the_runs_start(tmp_path: Path) -> None:
    """A run's wall-time budget counts from the run's start, not from the shadow's first look at the run."""
    import time

    spec = {"version": 1, "default": "allow", "budgets": [{"name": "quick", "limit": {"wall_time": "1s"}}]}
    gate, ctx, path, log = _shadowed(tmp_path, spec)
    time.sleep(1.1)  # past the run's limit before its first call
    record = gate.submit("look", {"q": "a"}, context=ctx).record
    assert (record.status, record.budget) == ("denied", "quick")
    assert _disagreements(spec, gate, ctx, path, log) == []


def test_a_managed_agents_own_steps_do_not_start_the_runs_step_afresh_in_replay(tmp_path: Path) -> None:
    """A managed agent counts its own steps from 0 (its intents say step 0 while the run is at step 1): the run's
    `per: step` budgets go on counting the run's step, in replay as in the gate."""
    spec = {"version": 1, "default": "allow",
            "budgets": [{"name": "per-step", "per": "step", "match": {"tool": "look"}, "limit": {"calls": 2}}]}
    gate, ctx, path, log = _shadowed(tmp_path, spec)
    ctx.next_step()
    sub = ctx.delegate("sub", ledger=StackedLedger(ctx.ledger, None, agent="sub"), tools=gate.tools, layer=None,
                       parent_call_id="call_parent")
    statuses = [gate.submit("look", {"q": "a"}, context=c).record.status for c in (ctx, sub, ctx, sub)]
    assert statuses == ["ok", "ok", "denied", "denied"]
    assert _disagreements(spec, gate, ctx, path, log) == []


@tool(side_effect="write")
def tag(key: str, value: dict = None, n: int = None) -> str:  # type: ignore[assignment,type-arg]  # noqa: RUF013
    """Tag an item (written as much user code writes its defaults: `x: T = None`).

    Args:
        key: The item.
        value: Extra data.
        n: A count.
    """
    return f"tagged {key}"


def test_the_gates_validated_arguments_pass_validation_again(tmp_path: Path) -> None:
    """`x: T = None`: the gate completes the default (None) into the arguments it decides and shows; those
    arguments are valid again — an approver's edit of what it was shown, a history entry or a cases file
    that restates them — and decided as the call that left them out."""
    tagger = as_tool(tag)
    validated = tagger.validate({"key": "a"})
    assert validated == {"key": "a", "value": None, "n": None}
    assert tagger.validate(validated) == validated

    def edit(request: ApprovalRequest) -> ApprovalDecision:
        return ApprovalDecision("edit", request.binding, "editor", "edited", args={**request.args, "key": "b"})

    policy = Policy.from_dict({"version": 1, "default": "require_approval"})
    gate = Gate(policy, tools=[tagger], approver=CallbackApprover(edit), ledger=MemoryLedger())
    ctx = gate.start_run()
    record = gate.submit("tag", {"key": "a"}, context=ctx).record
    assert (record.status, record.args) == ("ok", {"key": "b", "value": None, "n": None}), record.error
    entry = tuple(ctx.history_view())[-1]
    simulated = decide_like_gate(policy, Call(tool="tag", args={"key": "c"}, history=(entry,), run=ctx.info),
                                 [tagger])
    assert simulated.decision.outcome == "require_approval"
    with pytest.raises(ToolDenied, match="argument 'n'"):
        tagger.validate({"key": "a", "n": "many"})


@tool(side_effect="external", cost=2)
def post_priced(to: str) -> str:
    """Post at the tool's own price (the policy declares none).

    Args:
        to: Where.
    """
    return f"posted to {to}"


def test_a_budget_holding_a_cost_the_log_does_not_give_makes_its_readers_undecidable(tmp_path: Path) -> None:
    """The tool's own cost is not in the log: its calls are undecidable, and so is every later call whose
    decision reads what that budget holds (a `usage` condition, or the budget counting its cost) — never
    decided over a usage that left those costs out."""
    spec = {"version": 1, "default": "allow",
            "budgets": [{"name": "money", "match": {"tool": ["post", "send"]}, "limit": {"cost": 100}},
                        {"name": "calls", "match": {"tool": "post"}, "limit": {"calls": 10}}],
            "rules": [{"name": "spent", "match": {"tool": "look"}, "when": "usage.money.cost >= 3.0",
                       "decision": "deny"},
                      {"name": "counted", "match": {"tool": "look"}, "when": "usage.calls.calls >= 5",
                       "decision": "deny"}]}
    priced = replace(as_tool(post_priced), name="post")
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    policy = Policy.from_dict(spec)
    gate = Gate(policy, audit=log, tools=[*(t for n, t in TOOLS.items() if n != "post"), priced],
                shadow=Policy.from_dict(spec), ledger=MemoryLedger())
    ctx = gate.start_run()
    statuses = [gate.submit(name, args, context=ctx).record.status
                for name, args in [LOOKS[0], ("post", {"to": "a"}), ("post", {"to": "b"}), LOOKS[0], SENDS[0]]]
    gate.finish_run(ctx)
    log.close()
    assert statuses == ["ok", "ok", "ok", "denied", "ok"]
    report = replay_log(policy, str(path))
    assert (report.changed, report.unchanged, report.undecidable) == (0, 1, 4), report.as_dict()
    assert any("cannot give" in why for why in report.undecidable_why)


HISTORY_RULE = {"version": 1, "default": "allow",
                "rules": [{"name": "once", "match": {"tool": "look"},
                           "when": "history.exists(c, c.tool == 'look' && c.status == 'ok')", "decision": "deny"}]}


def _resumed_log(tmp: Path) -> tuple[Path, Policy]:
    """A run that looked once, ended interrupted, and was resumed (its history restored, as a durable run's
    is) to look again: the second look is denied by the history rule."""
    policy = Policy.from_dict(HISTORY_RULE)
    path = tmp / "audit.jsonl"
    log = AuditLog(path)
    gate = Gate(policy, audit=log, tools=TOOLS.values(), ledger=MemoryLedger())
    ctx = gate.start_run(principal="alice")
    assert gate.submit("look", {"q": "a"}, context=ctx).record.status == "ok"
    kept = tuple(ctx.history_view())
    gate.finish_run(ctx, status="interrupted")
    again = gate.resume_run(ctx.info)
    for entry in kept:
        again.remember_entry(entry, ctx.records[0])
    assert gate.submit("look", {"q": "b"}, context=again).record.status == "denied"
    gate.finish_run(again)
    log.close()
    return path, policy


def test_a_run_resumed_after_it_ended_interrupted_keeps_its_history_in_replay(tmp_path: Path) -> None:
    """An interrupted run is taken up again by `resume` (`run_resumed` after its `run_finished`): replay goes
    on with the run it rebuilt, never with an empty one."""
    path, policy = _resumed_log(tmp_path)
    report = replay_log(policy, str(path))
    assert (report.changed, report.unchanged) == (0, 2), report.as_dict()


def test_a_log_that_begins_at_a_resume_cannot_say_the_runs_earlier_calls(tmp_path: Path) -> None:
    """A log holding a run from its `run_resumed` on (its start in another log): a decision reading the run is
    undecidable, as for a log that begins mid-run."""
    path, policy = _resumed_log(tmp_path)
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "run_resumed")
    tail = tmp_path / "tail.jsonl"
    tail.write_text("\n".join(lines[start:]) + "\n")
    report = replay_log(policy, str(tail))
    assert (report.changed, report.undecidable) == (0, 1), report.as_dict()


def test_what_a_managed_agents_own_policy_added_to_the_run_is_not_guessed_in_replay(tmp_path: Path) -> None:
    """The agent's own policy labels its looks `secret` and classes them destructive: the run's `seen` and
    history hold what the narrowed call added. A later call of the run whose decision reads them is
    undecidable in replay (the log has that policy's fingerprint only), never decided without them."""
    run_spec = {"version": 1, "default": "allow",
                "tools": {"look": {"side_effect": "read"}, "put": {"side_effect": "destructive"}},
                "budgets": [{"name": "one-destructive", "match": {"side_effect": "destructive"},
                             "limit": {"calls": 1}}],
                "rules": [{"name": "no-send-after-secret", "match": {"tool": "send"}, "when": "'secret' in seen",
                           "decision": "deny"},
                          {"name": "no-post-after-destructive", "match": {"tool": "post"},
                           "when": "history.exists(c, c.side_effect == 'destructive')", "decision": "deny"},
                          {"name": "long-runs", "match": {"tool": "look"},
                           "when": "history.size() > 5", "decision": "deny"}]}
    run_policy = Policy.from_dict(run_spec)
    own_policy = Policy.from_dict({"version": 1, "default": "allow",
                                   "tools": {"look": {"labels": ["secret"], "side_effect": "destructive"}}})
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    gate = Gate(run_policy, audit=log, tools=TOOLS.values(), shadow=Policy.from_dict(run_spec), ledger=MemoryLedger())
    ctx = gate.start_run()
    own = Layer("sub", own_policy, own_policy.new_ledger(replace(ctx.info, step=0, agent="sub"), gate.ledger))
    sub = ctx.delegate("sub", ledger=StackedLedger(ctx.ledger, own.ledger, agent="sub"), tools=gate.tools,
                       layer=own, parent_call_id="call_parent")
    assert gate.submit("look", {"q": "a"}, context=sub).record.status == "ok"
    statuses = [gate.submit(name, args, context=ctx).record.status
                for name, args in [SENDS[0], ("post", {"to": "a", "n": 3}), LOOKS[0], ("put", {"key": "zz"})]]
    assert statuses == ["denied", "denied", "ok", "denied"]  # the put: the narrowed look was destructive
    gate.finish_run(ctx)
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert not [r for r in records if r["kind"] == "shadow_decision"]
    report = replay_log(run_policy, str(path))
    # the narrowed look, and the send and post reading what it added; the last look reads how many calls ran,
    # and the put is refused by the budget that counted the narrowed look as destructive, as the gate counted it
    assert (report.changed, report.undecidable, report.unchanged) == (0, 3, 2), report.as_dict()


def test_a_let_name_that_reads_a_redacted_argument_is_undecidable(tmp_path: Path) -> None:
    """`let:` names are read as what they stand for: a condition naming one that reads a redacted argument (or
    where values came from) is undecidable in replay, as the expression written out would be."""
    spec = {"version": 1, "default": "allow", "tools": {"send": {"redact": ["body"], "cost": "args.amount"}},
            "let": {"secretive": "args.body.contains('s3cret')", "mentions(word)": "args.body.contains(word)",
                    "tainted": "'untrusted' in provenance(args.to)"},
            "rules": [{"name": "no-secret", "match": {"tool": "send"}, "when": "secretive", "decision": "deny"},
                      {"name": "no-pay", "match": {"tool": "send"}, "when": "mentions('pay')",
                       "decision": "require_approval"},
                      {"name": "taint", "match": {"tool": "post"}, "when": "tainted", "decision": "deny"}]}
    got = run_script(tmp_path, spec, [(None, {}, [("send", {"to": "a", "body": "s3cret"}),
                                                  ("send", {"to": "a", "body": "pay me"}),
                                                  ("send", {"to": "a", "body": "hi"}), POSTS[2]])])
    got.assert_agree()
    assert [v[2][0] for v in got.verdicts] == ["deny", "require_approval", "allow", "allow"]
    assert got.report is not None and got.report.undecidable == 4, got.report.as_dict()


def test_a_condition_that_raises_denies_on_every_path(tmp_path: Path) -> None:
    """An allow rule whose condition raises (a division by zero, a missing key) denies, naming why — in the
    gate, `policy test`, the shadow and replay alike — whatever the default."""
    for default in ("allow", "require_approval", "deny"):
        spec = {"version": 1, "default": default,
                "rules": [{"name": "divides", "match": {"tool": "post"}, "when": "100 / (args.n - 2) > 1",
                           "decision": "allow"},
                          {"name": "keyed", "match": {"tool": "look"}, "when": "args.nope == 1", "decision": "allow"}]}
        got = run_script(tmp_path, spec, [(None, {}, [POSTS[0], LOOKS[0], POSTS[2]])])
        got.assert_agree()
        assert [v[2][0] for v in got.verdicts] == ["deny", "deny", "allow"], default
        refusals = [r["error"] for r in got.records if r["kind"] == "call_outcome" and r["status"] == "denied"]
        assert "division by zero" in refusals[0] and "no such key 'nope'" in refusals[1], refusals
