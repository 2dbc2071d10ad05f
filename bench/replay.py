"""`proctor policy replay` over a million recorded calls (issue #32.3).

Writes an audit log of N recorded calls (runs of 20 calls: reads, mail inside and outside
the company, the records the gate writes: run_started, call_intent, call_outcome,
run_finished) and replays it under a new policy whose rules read no history (a fixed
rule, a condition over the arguments, one per-run budget), on one core, at N = 100,000
and 1,000,000, side by side. Reading the log alone (the same reader, no decision) is
timed too, to show what the decisions add. Rates are CPU time of the one core the bench is
pinned to (wall time is printed beside it: on a shared machine it also counts other work).

Two new policies are replayed: rules without conditions ("fixed rules": the decision of a
(tool, class) is computed once), and CEL conditions over the arguments with a per-run budget
(each call evaluated by CEL, reserved and settled).

Run: .venv/bin/python bench/replay.py [--calls 1000000]
Target: >= 100,000 calls/s for the fixed rules at the largest N; linear for both: the time per
call at the largest N is <= 1.25x the time per call at N/10.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import orjson

from proctor import Policy
from proctor.policy.replay import iter_log_records, replay_log

OLD = """
version: 1
tools:
  lookup: {side_effect: read}
  send_email: {side_effect: external}
rules:
  - {name: reads, match: {side_effect: read}, decision: allow}
  - name: internal-mail
    match: {tool: send_email}
    when: "args.to.endsWith('@example.com')"
    decision: allow
"""
NEW = OLD + """
  - name: no-contractors
    match: {tool: send_email}
    when: "args.to.startsWith('contractor')"
    decision: deny
budgets:
  - {name: run-calls, limit: {calls: 19}}
"""
#: Rules without conditions (each (tool, class) decided once for all its calls), no budgets.
FIXED = """
version: 1
tools:
  lookup: {side_effect: read}
  send_email: {side_effect: external}
rules:
  - {name: reads, match: {side_effect: read}, decision: allow}
  - {name: mail, match: {tool: send_email}, decision: require_approval}
"""
TARGET_CALLS_S = 100_000
LINEAR = 1.25


def write_log(path: Path, calls: int, sha: str) -> None:
    seq = 0
    ts = 1_760_000_000_000_000_000
    with path.open("wb") as f:
        def emit(kind: str, fields: dict[str, object]) -> None:
            nonlocal seq, ts
            rec = {"seq": seq, "ts_ns": ts, "kind": kind, "prev": "0" * 64, "h": "0" * 64, **fields}
            f.write(orjson.dumps(rec, option=orjson.OPT_SORT_KEYS) + b"\n")
            seq += 1
            ts += 1000
        for n in range(calls):
            run = f"run_{n // 20:08d}"
            if n % 20 == 0:
                emit("run_started", {"run_id": run, "principal": f"user{n % 7}", "labels": {"env": "prod"},
                                     "policy_sha256": sha})
            i = n % 5
            if i < 3:
                tool, args, decision, rules = "lookup", {"order": str(n)}, "allow", ["reads"]
            elif i == 3:
                who = "contractor" if n % 10 == 3 else "ann"
                tool, args, decision, rules = "send_email", {"to": f"{who}{n}@example.com", "body": "hi"}, "allow", [
                    "internal-mail"]
            else:
                tool, args, decision, rules = "send_email", {"to": f"x{n}@elsewhere.org", "body": "hi"}, "deny", []
            call = f"call_{n:010d}"
            emit("call_intent", {"run_id": run, "step": 0, "principal": f"user{n % 7}", "call_id": call, "tool": tool,
                                 "side_effect": "read" if tool == "lookup" else "external", "args": args,
                                 "args_digest": "hmac-sha256:" + "0" * 64, "decision": decision, "rules": rules,
                                 "reason": "", "policy_sha256": sha, "approval": None, "trace_id": None,
                                 "span_id": None})
            emit("call_outcome", {"run_id": run, "call_id": call, "tool": tool,
                                  "status": "ok" if decision == "allow" else "denied", "duration_ns": 1000,
                                  "error": None, "policy_sha256": sha, "trace_id": None, "span_id": None})
            if n % 20 == 19:
                emit("run_finished", {"run_id": run, "status": "done", "calls": {}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1_000_000)
    opts = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    old = Policy.from_string(OLD)
    subjects = {"fixed rules": Policy.from_string(FIXED), "conditions over args + a budget": Policy.from_string(NEW)}
    sizes = (opts.calls // 10, opts.calls)
    with tempfile.TemporaryDirectory(prefix="proctor-bench-replay-") as tmp:
        logs = {}
        for size in sizes:
            logs[size] = Path(tmp) / f"audit-{size}.jsonl"
            write_log(logs[size], size, old.sha256)
        per_call: dict[tuple[str, int], float] = {}
        for size in sizes:
            t0 = time.process_time()
            records = sum(1 for _ in iter_log_records(str(logs[size])))
            read_only = (time.process_time() - t0) / size
            print(f"N={size:>9,}: reading the {records:,} records alone: {read_only * 1e6:.2f} µs/call of CPU")
            for name, new in subjects.items():
                t0, w0 = time.process_time(), time.perf_counter()
                # (its records are not a hash chain: what is timed is the decisions; `proctor audit verify`'s
                # own speed is bench/audit.py's)
                report = replay_log(new, str(logs[size]), verify=False)
                per_call[name, size] = cpu = (time.process_time() - t0) / size
                wall = (time.perf_counter() - w0) / size
                assert report.decided == size, report.as_dict()
                print(f"N={size:>9,}: {name:<32} {1 / cpu:>9,.0f} calls/s ({cpu * 1e6:.2f} µs/call of CPU, "
                      f"{wall * 1e6:.2f} of wall time); {report.changed:,} changed, {report.undecidable} undecidable")
    small, large = sizes
    ok = True
    for name in subjects:
        ratio = per_call[name, large] / per_call[name, small]
        rate = 1 / per_call[name, large]
        print(f"{name}: µs/call at N={large:,} / at N={small:,} = {ratio:.2f} (linear: <= {LINEAR}); "
              f"{rate:,.0f} calls/s = {rate / TARGET_CALLS_S:.2f}x the {TARGET_CALLS_S:,} calls/s target")
        ok = ok and ratio <= LINEAR and (name != "fixed rules" or rate >= TARGET_CALLS_S)
    print("target met" if ok else "TARGET MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
