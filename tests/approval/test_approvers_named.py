"""Approvers named by policy and proven (`approvers:`), on every path an answer takes, and what the trail says.

A real gate suspends a real call in a real SQLite store; answers come through the store CLI (as this
process's OS account), through the inbox's API (bearer tokens from a real token file), straight into
the store (a forged row), and at the console; the gate's `approval_resolved` record is read back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from approval_helpers import make_request
from fastapi.testclient import TestClient

from proctor.approval import ConsoleApprover
from proctor.approval.inbox import InboxApprover
from proctor.approval.tokens import TokenFile, add_token
from proctor.cli import main
from proctor.errors import ApprovalDenied, PolicyError, RunSuspended
from proctor.gate import Gate
from proctor.gate.run import RunContext
from proctor.policy import Policy
from proctor.policy.approvers import Answerer, ApproverRule, OsUser, os_account, os_answerer, refusal
from proctor.serve.app import create_app
from proctor.store.answerseal import PURPOSE as ANSWER_PURPOSE
from proctor.store.answerseal import AnswerSeal
from proctor.store.base import ApprovalAnswer, PendingApproval, RunStore
from proctor.testing import InMemoryAudit
from proctor.tools import tool

RAN: list[dict[str, Any]] = []
ME = os_account()


@tool(side_effect="destructive")
def kubectl(verb: str, replicas: int, token: str = "") -> str:
    """Run kubectl.

    Args:
        verb: What to do.
        replicas: How many.
        token: A credential (redacted in the trail).
    """
    RAN.append({"verb": verb, "replicas": replicas})
    return f"{verb} {replicas}"


class World:
    """A store, a token file (bob in sre-leads, mallory in none) and the gates built over them."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.url = f"sqlite:///{tmp}/runs.db"
        self.store = RunStore.open(self.url)
        self.tokens_path = tmp / "tokens.txt"
        self.tokens = {"bob": add_token(self.tokens_path, "bob", ("sre-leads",)),
                       "mallory": add_token(self.tokens_path, "mallory"),
                       "alice": add_token(self.tokens_path, "alice", ("sre-leads",))}
        self.audit = InMemoryAudit()
        #: What the inbox and the CLI seal answers with: the key of the gates' trail for answers.
        self.seal = AnswerSeal(self.audit.key_for(ANSWER_PURPOSE))
        #: The same key as a file, for the store CLI (`--answer-key`).
        self.key_file = tmp / "answer.key"
        self.seal.write(self.key_file)

    def answer(self, pending: PendingApproval, answer: ApprovalAnswer) -> None:
        """Store `answer`, sealed under the answer key (as an answerer holding it would)."""
        self.store.answer_approval(pending.id, self.seal.sealed(pending, answer), binding=pending.binding)

    def policy(self, os_users: dict[str, Any] | None = None,
               approvers: dict[str, Any] | None = None, tokens: bool = True) -> Policy:
        named = {"tokens": str(self.tokens_path)} if tokens else {}
        return Policy.from_dict({
            "version": 1,
            "tools": {"kubectl": {"side_effect": "destructive", "redact": ["token"]}},
            "rules": [{"name": "prod-change", "match": {"tool": "kubectl"}, "decision": "require_approval",
                       "reason": "production changes need an SRE lead",
                       "approvers": approvers or {"groups": ["sre-leads"], "not": "principal"}}],
            "approval": {"timeout": "5m", **named, "os_users": os_users or {}},
        })

    def suspend(self, policy: Policy, principal: str = "alice",
                args: dict[str, Any] | None = None) -> tuple[Gate, RunContext, PendingApproval]:
        """`principal`'s run asks for `kubectl` with `args` (default: scale to 0) and waits: gate, run, approval."""
        gate = Gate(policy, approver=InboxApprover(self.store), audit=self.audit, tools=[kubectl])
        ctx = gate.start_run(principal=principal)
        with pytest.raises(RunSuspended):
            gate.call("kubectl", args or {"verb": "scale", "replicas": 0, "token": "s3cret"}, context=ctx,
                      call_id="c1")
        [pending] = self.store.list_approvals()
        return gate, ctx, pending

    def resume(self, gate: Gate, ctx: RunContext) -> Any:
        return gate.call("kubectl", {"verb": "scale", "replicas": 0, "token": "s3cret"}, context=ctx, call_id="c1")

    def resolved(self) -> dict[str, Any]:
        found = [r for r in self.audit.records if r["kind"] == "approval_resolved" and r.get("verdict") != "suspended"]
        assert found, [r["kind"] for r in self.audit.records]
        return found[-1]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    RAN.clear()
    w = World(tmp_path)
    yield w
    w.store.close()


# -- the rule itself ---------------------------------------------------------------------------------

def test_refusal_names_what_the_policy_asks() -> None:
    spec = ApproverRule("rule 'prod-change'", groups=("sre-leads",), excluded=("principal",))
    assert refusal(Answerer("bob", "token", ("sre-leads",)), [spec], "alice") is None
    why = refusal(Answerer("mallory", "token", ()), [spec], "alice")
    assert why == "mallory may not answer this call: rule 'prod-change' asks for a member of sre-leads"
    assert "principal" in (refusal(Answerer("alice", "token", ("sre-leads",)), [spec], "alice") or "")
    # the principal's own OS account acting as someone else is still the principal
    assert "principal" in (refusal(Answerer("carol", "os-user", ("sre-leads",), "alice"), [spec], "alice") or "")
    # a webhook's or a callback's word proves no groups
    assert "proves no groups" in (refusal(Answerer("bob", "webhook-signature", None), [spec], "alice") or "")
    assert refusal(Answerer("dave", "callback", None), [ApproverRule("r", users=("dave",))], "alice") is None
    assert refusal(Answerer("eve", "token", ()), [ApproverRule("r", excluded=("eve",))], None) == \
        "eve may not answer this call (r: not: eve)"


def test_os_accounts_act_only_as_mapped() -> None:
    users = {"root": OsUser(("carol",), ("sre-leads",))}
    assert os_answerer("root", "carol", users) == Answerer("carol", "os-user", ("sre-leads",), "root")
    assert "may not answer as 'dave'" in str(os_answerer("root", "dave", users))
    assert "may not answer as 'carol'" in str(os_answerer("alice", "carol", users))
    assert os_answerer("alice", None, users) == Answerer("alice", "os-user", (), "alice")


def test_policy_names_approvers_and_located_errors(tmp_path: Path) -> None:
    p = Policy.from_dict({"version": 1, "rules": [
        {"name": "a", "match": {"tool": "x"}, "decision": "require_approval", "approvers": {"users": "dave"}},
        {"name": "b", "match": {"tool": "x"}, "decision": "require_approval"}],
        "approval": {"approvers": {"groups": ["ops"], "not": "principal"}}})
    specs = p.approval.approvers_for(("a", "b"))
    assert [(s.source, s.users, s.groups, s.excluded) for s in specs] == [
        ("rule 'a'", ("dave",), (), ()), ("approval.approvers", (), ("ops",), ("principal",))]
    bad = tmp_path / "p.yaml"
    bad.write_text("version: 1\nrules:\n  - name: r\n    decision: require_approval\n"
                   "    approvers: {groups: [x], nott: principal}\n")
    with pytest.raises(PolicyError, match=r"p.yaml:5:30: rule 'r': unknown key 'nott' \(did you mean 'not'\?\)"):
        Policy.from_yaml(bad)


# -- the store CLI -----------------------------------------------------------------------------------

def test_cli_as_is_refused_unless_mapped_and_the_principal_never_answers(
        world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """The principal's own OS account answering `--as carol` is refused when not mapped, and as itself
    it is the principal."""
    _, _, pending = world.suspend(world.policy(), principal=ME)
    capsys.readouterr()
    assert main(["approvals", "approve", pending.id, "--store", world.url, "--answer-key", str(world.key_file),
                 "--as", "carol"]) == 1
    err = capsys.readouterr().err
    assert f"OS user {ME!r} may not answer as 'carol'" in err and len(err.strip().splitlines()) == 1
    assert main(["approvals", "approve", pending.id, "--store", world.url, "--answer-key", str(world.key_file)]) == 1
    assert "principal" in capsys.readouterr().err
    assert world.store.get_approval(pending.id).status == "pending"


def test_cli_groups_come_from_the_os_mapping(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    """Mapped to act as carol but in no group: refused; mapped into sre-leads: taken, and the trail names
    carol, the OS account, the method, the answer's own time and its reason."""
    _, _, pending = world.suspend(world.policy(os_users={ME: {"as": ["carol"]}}))
    assert main(["approvals", "approve", pending.id, "--store", world.url, "--answer-key", str(world.key_file),
                 "--as", "carol"]) == 1
    assert "asks for a member of sre-leads" in capsys.readouterr().err
    world.store.void_approval(pending.id)

    gate, ctx, pending = world.suspend(world.policy(os_users={ME: {"as": ["carol"], "groups": ["sre-leads"]}}))
    assert main(["approvals", "approve", pending.id, "--store", world.url, "--answer-key", str(world.key_file),
                 "--as", "carol",
                 "--reason", "checked the rollout"]) == 0
    stored = world.store.get_approval(pending.id).answer
    assert stored is not None and (stored.approver, stored.os_user, stored.method) == ("carol", ME, "os-user")
    assert world.resume(gate, ctx) == "scale 0"
    rec = world.resolved()
    assert (rec["approver"], rec["os_user"], rec["method"], rec["reason"]) == ("carol", ME, "os-user",
                                                                              "checked the rollout")
    assert rec["answered_at_ns"] == stored.answered_at_ns and rec["address"].startswith("cli:")
    assert rec["refused"] is None


# -- the inbox API -----------------------------------------------------------------------------------

def test_inbox_api_enforces_groups_from_the_token_file(world: World) -> None:
    gate, ctx, pending = world.suspend(world.policy())
    body = {"decision": "edit", "binding": pending.binding, "reason": "two replicas, not none",
            "args": {"verb": "scale", "replicas": 2, "token": "n3w"}}
    with TestClient(create_app(world.store, TokenFile.load(world.tokens_path), answers=world.seal),
                    base_url="http://inbox.test") as c:
        refused = c.post(f"/api/approvals/{pending.id}", json=body,
                         headers={"Authorization": f"Bearer {world.tokens['mallory']}"})
        assert refused.status_code == 403
        assert "mallory may not answer this call" in refused.text and "sre-leads" in refused.text
        own = c.post(f"/api/approvals/{pending.id}", json=body,
                     headers={"Authorization": f"Bearer {world.tokens['alice']}"})
        assert own.status_code == 403 and "principal" in own.text
        ok = c.post(f"/api/approvals/{pending.id}", json=body,
                    headers={"Authorization": f"Bearer {world.tokens['bob']}"})
        assert ok.status_code == 200, ok.text
    assert world.resume(gate, ctx) == "scale 2"
    rec = world.resolved()
    assert (rec["verdict"], rec["approver"], rec["method"], rec["address"]) == ("edit", "bob", "token",
                                                                                "testclient")
    assert rec["reason"] == "two replicas, not none"
    # original and edited arguments side by side, both redacted as the intent record is
    edited = rec["edited"]
    assert edited["original_args"]["replicas"] == 0 and edited["args"]["replicas"] == 2
    assert "s3cret" not in json.dumps(rec) and "n3w" not in json.dumps(rec)
    assert edited["original_args"]["token"] != "s3cret" and edited["digest"] != edited["original_digest"]
    requested = [r for r in world.audit.records if r["kind"] == "approval_requested"]
    assert requested[0]["approvers"] == [{"source": "rule 'prod-change'", "groups": ["sre-leads"], "users": [],
                                          "not": ["principal"]}]


def test_token_file_groups_and_the_serve_token_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.txt"
    assert main(["serve", "token", "dave", "--tokens", str(path), "--groups", "sre-leads,dba"]) == 0
    token = capsys.readouterr().out.split()[-1]
    loaded = TokenFile.load(path)
    assert loaded.who(token) == "dave" and loaded.groups["dave"] == ("sre-leads", "dba")
    assert main(["serve", "token", "eve", "--tokens", str(path), "--groups", "bad group"]) == 2


# -- the gate's own check ----------------------------------------------------------------------------

@pytest.mark.parametrize(("forged", "why"), [
    (ApprovalAnswer("approve", "mallory", method="token"), "mallory may not answer this call"),
    (ApprovalAnswer("approve", "nobody", method="token"), "nobody has no token in"),
    (ApprovalAnswer("approve", "carol", method="os-user", os_user="carol"), "asks for a member of sre-leads"),
    (ApprovalAnswer("approve", "alice", method="token"), "principal"),
    (ApprovalAnswer("approve", "bob", method="webhook-signature"), "proves no groups"),
])
def test_a_forged_store_answer_is_refused_at_the_gate_and_audited(world: World, forged: ApprovalAnswer,
                                                                   why: str) -> None:
    """An answer sealed under the answer key (an answerer that holds it, skipping its own checks) naming an
    approver outside the group does not pass the gate: it re-checks that approver's groups with the token
    file and mapping it reads. (A row without a good seal is not even read: tests/serve/test_answer_seals.py.)"""
    gate, ctx, pending = world.suspend(world.policy())
    world.answer(pending, forged)
    with pytest.raises(ApprovalDenied, match=why):
        world.resume(gate, ctx)
    assert RAN == []
    rec = world.resolved()
    assert rec["verdict"] == "denied" and why in rec["refused"] and rec["answered_by"] == forged.approver


# -- the console ---------------------------------------------------------------------------------------

def test_console_never_asks_the_principal() -> None:
    """With `not: principal`, the terminal's OS account that is the run's principal is never asked."""
    base = make_request()
    from dataclasses import replace

    request = replace(base, run=replace(base.run, principal=ME),
                      approvers=(ApproverRule("rule 'x'", excluded=("principal",)),))
    decision = ConsoleApprover(timeout=5).request(request)
    assert decision.verdict == "deny" and "principal" in decision.reason
    assert (decision.method, decision.os_user) == ("console", ME)
    named = replace(base, approvers=(ApproverRule("rule 'x'", groups=("sre-leads",)),))
    decision = ConsoleApprover(timeout=5, approver_name="carol").request(named)
    assert decision.verdict == "deny" and "may not answer as 'carol'" in decision.reason


def test_an_answer_by_mcp_elicitation_is_judged_as_the_sessions_principal_at_the_gate() -> None:
    """`proctor mcp serve` names an elicited answer ``mcp-elicitation:<principal>``: the gate's own check
    takes it for that principal, so `not: principal` refuses it even from an approver that asked anyway."""
    from proctor.approval.base import ApprovalDecision, ApprovalRequest

    class Elicited:  # answers as `proctor mcp serve`'s approver names an elicited answer
        def request(self, request: ApprovalRequest) -> ApprovalDecision:
            return ApprovalDecision.approve(request, f"mcp-elicitation:{request.run.principal}", "mine",
                                            method="mcp-elicitation")

    policy = Policy.from_dict({"version": 1, "rules": [{"name": "scale", "match": {"tool": "kubectl"},
                                                        "decision": "require_approval",
                                                        "approvers": {"not": "principal"}}]})
    gate = Gate(policy, tools=[kubectl], approver=Elicited())
    with pytest.raises(ApprovalDenied, match="alice is the run's principal and may not answer"):
        gate.call("kubectl", {"verb": "scale", "replicas": 0}, context=gate.start_run(principal="alice"))
    plain = Gate(Policy.from_dict({"version": 1, "rules": [{"name": "scale", "match": {"tool": "kubectl"},
                                                         "decision": "require_approval"}]}),
                 tools=[kubectl], approver=Elicited())
    assert plain.call("kubectl", {"verb": "scale", "replicas": 1}, context=plain.start_run(principal="alice")) \
        == "scale 1"  # where the policy names nobody, the principal's own answer stands


def test_the_resume_is_its_own_fact(world: World) -> None:
    """`run_resumed` is written by the resuming process, with its host and pid, apart from the answer."""
    import os
    import socket

    gate, ctx, pending = world.suspend(world.policy())
    world.answer(pending, ApprovalAnswer("approve", "bob", method="token", answered_at_ns=1))
    again = gate.resume_run(ctx.info)
    assert world.resume(gate, again) == "scale 0"
    [resumed] = [r for r in world.audit.records if r["kind"] == "run_resumed"]
    assert (resumed["host"], resumed["pid"], resumed["run_id"]) == (socket.gethostname(), os.getpid(), ctx.info.id)
    assert world.resolved()["answered_at_ns"] == 1  # the answer's own time, not the resume's


def test_a_token_answer_the_gate_cannot_check_is_refused(world: World) -> None:
    """Groups asked for and no `approval.tokens` in the policy: the gate cannot know, so it refuses."""
    gate, ctx, pending = world.suspend(world.policy(tokens=False))
    world.answer(pending, ApprovalAnswer("approve", "bob", method="token"))
    with pytest.raises(ApprovalDenied, match=r"name the inbox's token file in the policy's approval\.tokens"):
        world.resume(gate, ctx)


def _tiered_policy(world: World) -> Policy:
    """Scaling is for SRE leads; scaling to zero replicas is for carol alone."""
    return Policy.from_dict({
        "version": 1,
        "tools": {"kubectl": {"side_effect": "destructive", "redact": ["token"]}},
        "rules": [{"name": "prod-change", "match": {"tool": "kubectl"}, "when": "args.replicas > 0",
                   "decision": "require_approval", "approvers": {"groups": ["sre-leads"], "not": "principal"}},
                  {"name": "prod-wipe", "match": {"tool": "kubectl"}, "when": "args.replicas == 0",
                   "decision": "require_approval", "approvers": {"users": ["carol"]}}],
        "approval": {"timeout": "5m", "tokens": str(world.tokens_path)},
    })


#: alice's run asks to scale to 2 replicas: an SRE lead's to approve under `_tiered_policy`.
SCALE_TO_TWO: dict[str, Any] = {"verb": "scale", "replicas": 2, "token": "s3cret"}


@pytest.mark.parametrize("path", ["store", "inbox"])
def test_an_edit_into_arguments_another_approver_must_answer_is_refused(world: World, path: str) -> None:
    """An approver admitted for the call as asked edits it into a call the policy reserves for someone else
    (scale to 0: carol's): the edit is decided again, and its approval is one bob may not give, so nothing
    runs and the trail names who edited what and why it was refused."""
    asked = dict(SCALE_TO_TWO)
    gate, ctx, pending = world.suspend(_tiered_policy(world), args=asked)
    edited = {"verb": "scale", "replicas": 0, "token": "s3cret"}
    if path == "store":
        world.answer(pending, ApprovalAnswer("edit", "bob", "none needed", method="token", args=edited))
    else:
        with TestClient(create_app(world.store, TokenFile.load(world.tokens_path), answers=world.seal),
                        base_url="http://inbox.test") as c:
            ok = c.post(f"/api/approvals/{pending.id}", headers={"Authorization": f"Bearer {world.tokens['bob']}"},
                        json={"decision": "edit", "binding": pending.binding, "reason": "none needed",
                              "args": edited})
            assert ok.status_code == 200, ok.text
    with pytest.raises(ApprovalDenied, match=r"edited call needs an approval of its own, and bob may not answer "
                                             r"this call: .*one of carol"):
        gate.call("kubectl", asked, context=ctx, call_id="c1")
    assert RAN == []
    rec = world.resolved()
    assert rec["verdict"] == "denied" and rec["answered_by"] == "bob" and "prod-wipe" in rec["refused"]
    outcome = [r for r in world.audit.records if r["kind"] == "call_outcome"][-1]
    assert outcome["status"] == "denied"


def test_an_edit_the_editor_may_also_approve_runs_edited(world: World) -> None:
    """The same edit within what bob may approve (2 replicas to 3) runs, as edited, and the trail says so."""
    asked = dict(SCALE_TO_TWO)
    gate, ctx, pending = world.suspend(_tiered_policy(world), args=asked)
    world.answer(pending, ApprovalAnswer("edit", "bob", "three", method="token",
                                         args={"verb": "scale", "replicas": 3, "token": "s3cret"}))
    assert gate.call("kubectl", asked, context=ctx, call_id="c1") == "scale 3"
    assert RAN == [{"verb": "scale", "replicas": 3}]
    rec = world.resolved()
    assert (rec["verdict"], rec["approver"]) == ("edit", "bob")
    assert rec["edited"]["original_args"]["replicas"] == 2 and rec["edited"]["args"]["replicas"] == 3


def test_a_grant_answers_no_later_call_that_another_approver_guards(world: World) -> None:
    """bob grants kubectl for the rest of the run while answering a scale to 2 (his to approve): the grant
    covers the next scale to 3, never a scale to 0, which the policy keeps for carol — that one asks."""
    asked = dict(SCALE_TO_TWO)
    gate, ctx, pending = world.suspend(_tiered_policy(world), args=asked)
    world.answer(pending, ApprovalAnswer("grant", "bob", "scale as you need", method="token",
                                         grant={"tool": "kubectl", "args": {}}))
    assert gate.call("kubectl", asked, context=ctx, call_id="c1") == "scale 2"
    assert gate.call("kubectl", {"verb": "scale", "replicas": 3}, context=ctx, call_id="c2") == "scale 3"
    with pytest.raises(RunSuspended):  # carol's call is asked about, not taken under bob's grant
        gate.call("kubectl", {"verb": "scale", "replicas": 0}, context=ctx, call_id="c3")
    assert RAN == [{"verb": "scale", "replicas": 2}, {"verb": "scale", "replicas": 3}]
    [wipe] = world.store.list_approvals()
    assert wipe.call_id == "c3" and wipe.rules == ["prod-wipe"]
