"""Policy.decide throughput and latency for policies of 10, 100 and 1,000 rules.

Each policy is a realistic mix: a few rules about the tools being called (with CEL
conditions over args and history), class-wide rules, and many rules about *other*
tools (the bulk of a large policy), half of them conditional, some by glob. The
calls decided rotate over an allowed mail, a mail needing approval, a read, a
charge over a limit and an unknown tool.

Run: .venv/bin/python bench/policy_decide.py [--n 20000]
Target (issue 2): p50 <= 20 µs at 100 rules, near-flat as non-matching rules are added.

The last section (issue 13) times a decision whose rule sums over a 1,000-entry history
(``sum(history.filter(…).map(…)) > 1000.0 - double(args.amount)``): through a Gate at
call #1,000 of its run (the run's incremental fold, see `proctor.policy.aggregates`) and
by `Policy.decide` over a plain 1,000-entry list (folded once per decision).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from proctor.calls import Call, HistoryEntry, RunInfo
from proctor.policy import Policy

CORE_RULES: list[dict[str, Any]] = [
    {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
    {"name": "internal-mail", "match": {"tool": "send_email"}, "when": "args.to.endsWith('@example.com')",
     "decision": "allow"},
    {"name": "external-mail", "match": {"tool": "send_email"}, "when": "!args.to.endsWith('@example.com')",
     "decision": "require_approval", "reason": "mail leaving the company needs a human"},
    {"name": "no-exfiltration", "match": {"side_effect": ["external", "destructive"]},
     "when": "history.exists(c, c.tool == 'read_secret')", "decision": "deny"},
    {"name": "charge-cap", "match": {"tool": "charge_card"}, "when": "args.amount > 1000.0", "decision": "deny"},
    {"name": "charges", "match": {"tool": "charge_card"}, "decision": "require_approval"},
]


def other_rules(count: int) -> list[dict[str, Any]]:
    """Rules about tools the benchmark never calls: what most of a big policy is."""
    rules = []
    for i in range(count):
        tool = f"svc{i // 4}_op{i % 4}"
        rule: dict[str, Any] = {"name": f"other-{i}", "decision": ("allow", "deny", "require_approval")[i % 3]}
        if i % 10 == 9:
            rule["match"] = {"tool": f"svc{i // 4}_*"}
        elif i % 10 == 8:
            rule["match"] = {"tool": [tool, f"legacy_{tool}"], "side_effect": "write"}
        else:
            rule["match"] = {"tool": tool}
        if i % 2:
            rule["when"] = f"args.limit > {i} && run.labels.env == 'prod'"
        rules.append(rule)
    return rules


def build(total: int) -> Policy:
    rules = CORE_RULES + other_rules(total - len(CORE_RULES))
    return Policy.from_dict({
        "version": 1,
        "tools": {"send_email": {"side_effect": "external"}, "get_weather": {"side_effect": "read"},
                  "charge_card": {"side_effect": "destructive"}},
        "rules": rules,
    })


RUN = RunInfo("run_bench", 3, "alice", {"env": "prod"})
HISTORY = (HistoryEntry("get_weather", {"city": "Paris"}, "read", "allow", "ok"),
           HistoryEntry("send_email", {"to": "a@example.com"}, "external", "allow", "ok"))
CALLS = [
    Call("send_email", {"to": "bob@example.com", "subject": "hi", "body": "see you"}, history=HISTORY, run=RUN),
    Call("send_email", {"to": "eve@partner.test", "subject": "hi", "body": "x"}, history=HISTORY, run=RUN),
    Call("get_weather", {"city": "Oslo"}, history=HISTORY, run=RUN),
    Call("charge_card", {"amount": 2500.0, "card_number": "4111"}, history=HISTORY, run=RUN),
    Call("unknown_tool", {"x": 1}, history=HISTORY, run=RUN),
]


def sample(policy: Policy, calls: list[Call], n: int) -> list[int]:
    """Latencies in ns of `n` decisions, rotating over `calls`."""
    clock = time.perf_counter_ns
    decide = policy.decide
    out = []
    for i in range(n):
        call = calls[i % len(calls)]
        t0 = clock()
        decide(call)
        out.append(clock() - t0)
    return out


def interleaved(policies: list[Policy], calls: list[Call], n: int, rounds: int = 10) -> list[list[int]]:
    """Samples per policy, measured in interleaved rounds so machine noise hits every size alike."""
    for policy in policies:
        sample(policy, calls, 500)  # warm the candidate caches
    samples: list[list[int]] = [[] for _ in policies]
    for _ in range(rounds):
        for i, policy in enumerate(policies):
            samples[i].extend(sample(policy, calls, n // rounds))
    return samples


def stats(samples: list[int]) -> tuple[float, float, float]:
    """(decisions per second of pure deciding time, p50 µs, p99 µs)."""
    cuts = statistics.quantiles(samples, n=100)
    return len(samples) / (sum(samples) / 1e9), cuts[49] / 1000, cuts[98] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="decisions per measurement")
    n = parser.parse_args().n
    sizes = (10, 100, 1000)
    policies = [build(total) for total in sizes]
    mixed = interleaved(policies, CALLS, n)
    mail = interleaved(policies, CALLS[:1], n // 2)
    print(f"Policy.decide, {n} decisions per size, rotating over {len(CALLS)} calls (history of 2 calls)")
    print(f"{'rules':>6} {'decisions/s':>12} {'p50 µs':>8} {'p99 µs':>8}   {'send_email p50 µs':>17}")
    for total, all_calls, one_call in zip(sizes, mixed, mail, strict=True):
        rate, p50, p99 = stats(all_calls)
        print(f"{total:>6} {rate:>12,.0f} {p50:>8.1f} {p99:>8.1f}   {stats(one_call)[1]:>17.1f}")
    print("flatness: p50 µs of one send_email call as rules that cannot match it are added")
    flat_sizes = (10, 100, 1000, 10000)
    flat = interleaved([build(total) for total in flat_sizes], CALLS[:1], n // 2)
    print("  " + " | ".join(f"{total} rules {stats(s)[1]:.1f}" for total, s in zip(flat_sizes, flat, strict=True)))
    history_sum(max(200, n // 50))


SUM_RULE = ("sum(history.filter(h, h.tool == 'wire' && h.status == 'ok').map(h, double(h.args.amount)))"
            " > 1000000000.0 - double(args.amount)")


def history_sum(n: int) -> None:
    """p50 µs of a decision under a sum() rule over 1,000 earlier calls: via a Gate, and via Policy.decide."""
    from proctor import Gate, tool

    @tool(side_effect="destructive")
    def wire(amount: float) -> str:
        """Wire money.

        Args:
            amount: How much.
        """
        return "ok"

    def per_call(condition: str) -> list[int]:
        policy = Policy.from_dict({"version": 1, "default": "allow", "rules": [
            {"name": "cap", "match": {"tool": "wire"}, "when": condition, "decision": "deny"}]})
        gate = Gate(policy, tools=[wire])
        ctx = gate.start_run()
        for i in range(1000):
            gate.call("wire", {"amount": float(i)}, context=ctx)
        clock = time.perf_counter_ns
        out = []
        for _ in range(n):  # each call adds an entry: the run grows from 1,000 by n calls
            t0 = clock()
            gate.call("wire", {"amount": 1.0}, context=ctx)
            out.append(clock() - t0)
        return out

    reference, through_gate = per_call("double(args.amount) > 1000000000.0"), per_call(SUM_RULE)
    policy = Policy.from_dict({"version": 1, "default": "allow", "rules": [
        {"name": "cap", "match": {"tool": "wire"}, "when": SUM_RULE, "decision": "deny"}]})
    history = tuple(HistoryEntry("wire", {"amount": float(i)}, "destructive", "allow", "ok") for i in range(1000))
    call = Call("wire", {"amount": 1.0}, side_effect="destructive", history=history, run=RUN)
    by_list = sample(policy, [call], min(n, 20))  # folded from scratch each time: slow, few samples
    gate_p50, ref_p50 = statistics.median(through_gate) / 1000, statistics.median(reference) / 1000
    print(f"sum() over a 1,000-entry history: p50 {gate_p50:.1f} µs per gate.call at call #1,000+ (no audit), "
          f"{gate_p50 / ref_p50:.2f}x the same call under a rule that reads no history ({ref_p50:.1f} µs); "
          f"{statistics.median(by_list) / 1000:.0f} µs per Policy.decide over a plain 1,000-entry list")


if __name__ == "__main__":
    main()
