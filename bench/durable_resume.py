"""Resuming a step that made 1,000 calls before its pause: what replaying them from the journal costs.

Run by hand: `.venv/bin/python bench/durable_resume.py [--calls 1000] [--rounds 5]`.

The step's program makes N allowed reads, then one call that needs approval. Side by side,
in one process, with the same interpreter (process isolation) and audit log:

- live:   the program run with no store and no audit log, the pending call approved at
          once (what the program costs: its compute and N + 1 gate round trips);
- replay: the resumed step (N calls answered from the SQLite journal, the approved
          call run live), plus reading the journal from the store.

replay - live is the replay cost (target: ≤ 50 ms for N = 1,000). Also printed: the
whole `agent.resume` (fresh worker, state restored, step re-run) and, for the record,
what a store adds while the run is live (a SQLite commit per intent and per outcome,
fsynced only for intents of calls with effects).

And what a resume's checks of the store cost (docs/durable.md, "Who can do what"): the
journal read, every seal, the run's records read back from the audit log and compared
with the store (`proctor.store.trail.behind_trail`), timed on the same suspended run just
before the resume that runs them; the resume with them against the resume less them, and
the in-process resume of the journal (read + replay) with and without them (target: ≤ 2x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel, tool
from proctor.approval import ApprovalDecision, CallbackApprover
from proctor.audit import AuditLog
from proctor.audit.base import AuditReader, AuditSink, AuditStartReader
from proctor.gate import Gate
from proctor.gate.journal import StepJournal
from proctor.interpreter import Interpreter
from proctor.store import AnswerSeal, ApprovalAnswer
from proctor.store.seal import PURPOSE, StoreSeal
from proctor.store.trail import behind_trail, trails

POLICY = {
    "version": 1,
    "default": "deny",
    "rules": [
        {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
        {"name": "mail", "match": {"tool": "send"}, "decision": "require_approval", "reason": "a human checks"},
    ],
}


@tool(side_effect="read")
def look(x: int) -> int:
    """Read a number.

    Args:
        x: Which one.
    """
    return x * 2


@tool(side_effect="external")
def send(to: str, body: str) -> str:
    """Send a message.

    Args:
        to: Recipient.
        body: Text.
    """
    return "sent"


def program(n: int) -> str:
    return (f"total = 0\nfor i in range({n}):\n    total += look(i)\n"
            "send('x@evil.test', str(total))\nfinal_answer(total)\n")


def live_ms(policy: Policy, code: str, audit_path: str | None) -> float:
    approver = CallbackApprover(lambda r: ApprovalDecision.approve(r, "bench"))
    audit = AuditLog(audit_path) if audit_path else None
    gate = Gate(policy, approver=approver, audit=audit, tools=[look, send])
    with Interpreter([look, send], gate, sandbox="process", timeout=120, hash_seed=0) as py:
        ctx = gate.start_run()
        ctx.next_step()
        t = time.perf_counter()
        r = py.run(code, context=ctx)
        elapsed = (time.perf_counter() - t) * 1000
    if audit is not None:
        audit.close()
    assert r.error is None, r.error
    return elapsed


def durable_round(policy: Policy, code: str, tmp: str, n: int) -> dict[str, float]:
    store = RunStore.open(f"sqlite:///{tmp}/runs.db")
    audit = f"{tmp}/audit.jsonl"
    reply = f"```py\n{code}```"
    with CodeAgent([look, send], ScriptedModel([reply]), policy, approver=InboxApprover(store), audit=audit,
                   store=store, sandbox="process", timeout=120) as agent:
        t = time.perf_counter()
        first = agent.run("bench")
        live_journaled = (time.perf_counter() - t) * 1000
    assert first.status == "suspended", first.error
    answers = AnswerSeal.of_trail(audit)  # as the inbox or the CLI seal an answer to the run
    [pending] = store.list_approvals()
    store.answer_approval(pending.id, answers.sealed(pending, ApprovalAnswer("approve", "bench")),
                          binding=pending.binding)

    # The replayed step alone, as `resume` runs it: journal read, fresh worker's run answered from it.
    t = time.perf_counter()
    entries = store.journal(first.run_id, 1)
    load = (time.perf_counter() - t) * 1000
    assert len(entries) == n + 1  # (the suspended call is journaled too)
    # (The run's trail's secret: its gate believes the answer sealed for the run.)
    bench_audit = AuditLog(f"{tmp}/replay-audit.jsonl", redaction_key=Path(f"{audit}.redact-key").read_bytes())
    gate = Gate(policy, approver=InboxApprover(store), audit=bench_audit, tools=[look, send])
    with Interpreter([look, send], gate, sandbox="process", timeout=120, hash_seed=0) as py:
        ctx = gate.start_run(run_id=first.run_id)
        ctx.next_step()
        ctx.journal = StepJournal(store, first.run_id, 1, entries)
        t = time.perf_counter()
        r = py.run(code, context=ctx)
        replay = (time.perf_counter() - t) * 1000
    bench_audit.close()
    assert r.error is None and ctx.journal.replayed == n, (r.error, ctx.journal.replayed)

    # The whole resume, end to end, on a copy of the run suspended again at the same point.
    with CodeAgent([look, send], ScriptedModel([reply]), policy, approver=InboxApprover(store), audit=audit,
                   store=store, sandbox="process", timeout=120) as agent:
        second = agent.run("bench")
    [pending] = store.list_approvals()
    store.answer_approval(pending.id, answers.sealed(pending, ApprovalAnswer("approve", "bench")),
                          binding=pending.binding)
    with CodeAgent([look, send], ScriptedModel([]), policy, approver=InboxApprover(store), audit=audit,
                   store=store, sandbox="process", timeout=120) as agent:
        agent.interpreter  # noqa: B018 - start the worker first: a resume's worker start is the same either way
        assert agent.audit is not None
        checks, read = min(resume_checks(store, agent.audit, second.run_id) for _ in range(3))
        t = time.perf_counter()
        done = agent.resume(second.run_id)
        resume = (time.perf_counter() - t) * 1000
    assert done.status in ("done", "max_steps"), done.error
    store.close()
    return {"load": load, "replay": replay, "resume": resume, "live_journaled": live_journaled, "checks": checks,
            "checks_read": read}


def resume_checks(store: RunStore, audit: AuditSink, run_id: str) -> tuple[float, float]:
    """What a resume checks before anything runs, as it checks it, and the journal read in it (which the
    resumed step then replays from): ms. (The seal key is the trail's.)"""
    assert isinstance(audit, AuditReader)
    key = audit.key_for(PURPOSE)
    t = time.perf_counter()
    record = store.get_run(run_id)
    journals = {step: store.journal(run_id, step) for step in range(1, record.step + 1)}
    read = (time.perf_counter() - t) * 1000
    StoreSeal(key).check_run(record, journals)
    records = (audit.run_records_from(run_id, record.audit_start)
               if record.audit_start is not None and isinstance(audit, AuditStartReader) else audit.run_records(run_id))
    problems = behind_trail(record, journals, trails(records, run_id).get(run_id))
    elapsed = (time.perf_counter() - t) * 1000
    assert not problems, problems
    return elapsed, read


def other_runs(log: AuditLog, runs: int, n: int) -> None:
    """`runs` runs of `n` calls each, as the gate records them (a run_started, an intent and an outcome a call)."""
    for r in range(runs):
        run_id = f"run_other{r:04d}{os.urandom(8).hex()}"
        log.append("run_started", {"run_id": run_id, "principal": "bench", "labels": {}}, durable=False)
        for i in range(n):
            call = {"run_id": run_id, "call_id": f"call_{run_id[4:]}_1_{i}", "tool": "look", "side_effect": "read",
                    "args": {"x": i}, "decision": "allow", "rules": ["reads"], "step": 1}
            log.append("call_intent", call, durable=False)
            log.append("call_outcome", {"run_id": run_id, "call_id": call["call_id"], "tool": "look", "status": "ok",
                                        "duration_ns": 1000}, durable=False)
        log.append("run_finished", {"run_id": run_id, "status": "done"}, durable=False)


def shared_log(policy: Policy, code: str, tmp: str, n: int, before: int, after: int) -> tuple[float, float, float]:
    """The checks of a run suspended in a log shared with `before` runs of n calls written before it started and
    `after` written while it waited: ms of the checks as a resume makes them, of the run's records read from its
    start (as they do), and read from the whole file (what they would cost without the run's start)."""
    path = f"{tmp}/shared-{before}-{after}.jsonl"
    with AuditLog(path) as log:
        other_runs(log, before, n)
    store = RunStore.open(f"sqlite:///{tmp}/shared-{before}-{after}.db")
    reply = f"```py\n{code}```"
    with CodeAgent([look, send], ScriptedModel([reply]), policy, approver=InboxApprover(store), audit=path,
                   store=store, sandbox="process", timeout=120) as agent:
        run = agent.run("bench")
    assert run.status == "suspended", run.error
    with AuditLog(path) as log:
        other_runs(log, after, n)
        hinted = min(resume_checks(store, log, run.run_id)[0] for _ in range(3))
        record = store.get_run(run.run_id)
        assert record.audit_start is not None
        start = record.audit_start
        assert log.run_records(run.run_id) == log.run_records_from(run.run_id, start)
        whole = min(_timed(lambda: log.run_records(run.run_id)) for _ in range(3))
        read = min(_timed(lambda: log.run_records_from(run.run_id, start)) for _ in range(3))
    store.close()
    return hinted, read, whole


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def in_process(policy: Policy, n: int, tmp: str) -> dict[str, float]:
    """N calls through `gate.submit` in process (no worker, no channel), live vs answered from a journal;
    the per-call difference is what replaying adds or saves, free of the worker and channel noise."""
    store = RunStore.open(f"sqlite:///{tmp}/inproc.db")
    gate = Gate(policy, tools=[look, send])
    ctx = gate.start_run(run_id="run_bench")
    ctx.next_step()
    ctx.journal = StepJournal(store, "run_bench", 1)
    for i in range(n):  # journal the step once, live
        gate.submit("look", {"x": i}, context=ctx)
    t = time.perf_counter()
    entries = store.journal("run_bench", 1)
    load = (time.perf_counter() - t) * 1000
    plain = gate.start_run()
    plain.next_step()
    t = time.perf_counter()
    for i in range(n):
        gate.submit("look", {"x": i}, context=plain)
    live = (time.perf_counter() - t) * 1000
    again = gate.start_run(run_id="run_bench")
    again.next_step()
    again.journal = StepJournal(store, "run_bench", 1, entries)
    t = time.perf_counter()
    for i in range(n):
        gate.submit("look", {"x": i}, context=again)
    replay = (time.perf_counter() - t) * 1000
    assert again.journal.replayed == n
    store.close()
    return {"ip_live": live, "ip_replay": replay, "ip_load": load}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shared", type=int, default=50,
                        help="also: the checks in a log shared with 1 and with this many other runs (0: skip)")
    args = parser.parse_args()
    policy = Policy.from_dict(POLICY)
    code = program(args.calls)
    rows: list[dict[str, float]] = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            live = live_ms(policy, code, None)
            audited = live_ms(policy, code, os.path.join(tmp, "live-audit.jsonl"))
            rows.append({"live": live, "audited": audited, **durable_round(policy, code, tmp, args.calls),
                         **in_process(policy, args.calls, tmp)})

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    cost = med("replay") + med("load") - med("live")
    print(f"calls before the pause: {args.calls}, rounds: {args.rounds}, load average: {os.getloadavg()[0]:.2f}")
    print(f"live step, no audit, no store:   {med('live'):8.1f} ms   (the program's own cost: compute + "
          f"{args.calls + 1} gate round trips)")
    print(f"live step, audit log, no store:  {med('audited'):8.1f} ms   (an fsynced intent per call)")
    print(f"replayed step (journal answers): {med('replay'):8.1f} ms   + journal read {med('load'):.1f} ms")
    print(f"replay cost (replay + read - live): {cost:6.1f} ms   target ≤ 50 ms")
    print(f"in process, {args.calls} gate.submit: live {med('ip_live'):.1f} ms, from the journal "
          f"{med('ip_replay'):.1f} ms (+ read {med('ip_load'):.1f} ms): replay cost "
          f"{med('ip_replay') + med('ip_load') - med('ip_live'):.1f} ms")
    checks, resume, bare = med("checks"), med("resume"), med("ip_replay") + med("ip_load")
    added = checks - med("checks_read")  # the journal read is the replay's too: read once, checked, replayed
    print(f"resume's store checks:           {checks:8.1f} ms   (journal read {med('checks_read'):.1f} ms, which the "
          f"step then replays from; seals; the run's audit records read and compared {added:.1f} ms)")
    print(f"agent.resume end to end:         {resume:8.1f} ms with the checks, {resume - added:.1f} ms less them: "
          f"{resume / (resume - added):.2f}x")
    print(f"{args.calls}-call journal resumed in process: read + replay {bare:.1f} ms without the checks, "
          f"{bare + added:.1f} ms with them: {(bare + added) / bare:.2f}x   target ≤ 2x")
    print(f"live run with audit + store:     {med('live_journaled'):8.1f} ms   (agent.run until suspended: "
          f"{(med('live_journaled') - med('audited')) / args.calls * 1000:.0f} µs a call more than the audit alone)")
    if args.shared:
        with tempfile.TemporaryDirectory() as tmp:
            figures = {(b, a): shared_log(policy, code, tmp, args.calls, b, a)
                       for b, a in ((1, 0), (args.shared, 0), (0, 1), (0, args.shared))}
        for (b, a), (hinted, read, whole) in figures.items():
            where = f"{b:3d} other run(s) before it" if b else f"{a:3d} other run(s) after its start"
            print(f"log shared with {where} ({args.calls} calls each): store checks {hinted:6.1f} ms, of which "
                  f"the run's records read from its start {read:5.1f} ms (from the whole file: {whole:6.1f} ms)")


if __name__ == "__main__":
    main()
