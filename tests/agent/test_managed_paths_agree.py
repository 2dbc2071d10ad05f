"""A managed agent with its own policy, run by a real CodeAgent: an identical shadow never disagrees, and
`policy replay` of the run's log under the same policy changes nothing (the agent's narrowed calls are
undecidable: its own policy is named in the log by fingerprint only)."""

from __future__ import annotations

import json
from pathlib import Path

from proctor.agent import CodeAgent, ScriptedModel
from proctor.policy import Policy
from proctor.policy.replay import replay_log

from .conftest import delete_item, get_price, policy_data, program, send_note


def test_a_managed_agents_narrowed_calls_agree_in_the_shadow_and_replay(tmp_path: Path) -> None:
    """The researcher's own policy caps its price lookups at two (a budget of its own) and denies notes; the
    identical shadow refuses the third lookup by that budget too, and replay counts the four narrowed calls
    undecidable, the manager's own unchanged."""
    spec = policy_data(tools={"researcher": {"side_effect": "read"}},
                       budgets=[{"name": "run-calls", "limit": {"calls": 10}}])
    own = Policy.from_dict({"version": 1, "default": "allow",
                            "budgets": [{"name": "own-prices", "match": {"tool": "get_price"}, "limit": {"calls": 2}}],
                            "rules": [{"name": "no-notes", "match": {"tool": "send_note"}, "decision": "deny"}]})
    loop = ("out = []\nfor f in ['fig', 'plum', 'kiwi']:\n    try:\n        out.append(get_price(f))\n"
            "    except Exception as e:\n        out.append(type(e).__name__)\n"
            "try:\n    send_note('x', 'y')\nexcept Exception as e:\n    out.append(type(e).__name__)\n"
            "final_answer(out)")
    sub = CodeAgent([get_price, send_note, delete_item], ScriptedModel([program(loop)]), own,
                    name="researcher", description="Finds prices of fruit.")
    audit = tmp_path / "audit.jsonl"
    boss = CodeAgent([get_price, send_note], ScriptedModel([program(
        "r = researcher(task='prices')\np = get_price('fig')\nfinal_answer([r, p])")]), Policy.from_dict(spec),
        name="manager", managed_agents=[sub], audit=str(audit), shadow=Policy.from_dict(spec))
    with boss:
        result = boss.run("Prices?")
    assert result.status == "done", result.error
    assert result.answer[0] == [3.0, 0.5, "BudgetExceeded", "ToolDenied"], result.answer
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r for r in records if r["kind"] == "shadow_decision"] == []
    layered = [r for r in records if r["kind"] == "call_intent" and r.get("layers")]
    assert len(layered) == 4 and {r["layers"][0]["policy_sha256"] for r in layered} == {own.sha256}
    report = replay_log(Policy.from_dict(spec), str(audit))
    assert (report.changed, report.undecidable) == (0, 4), report.as_dict()
    assert report.unchanged == 2  # the manager's own calls: the agent-tool and its get_price


def test_a_managed_agents_own_per_step_budget_starts_afresh_in_the_shadow(tmp_path: Path) -> None:
    """The researcher's own policy allows one price lookup a step: its second step may look again, in the
    identical shadow's copy of its budgets as in the gate."""
    spec = policy_data(tools={"researcher": {"side_effect": "read"}})
    own = Policy.from_dict({"version": 1, "default": "allow", "budgets": [
        {"name": "one-a-step", "per": "step", "match": {"tool": "get_price"}, "limit": {"calls": 1}}]})
    twice = ("out = []\nfor f in ['fig', 'plum']:\n    try:\n        out.append(get_price(f))\n"
             "    except Exception as e:\n        out.append(type(e).__name__)\nprint(out)")
    sub = CodeAgent([get_price], ScriptedModel([program(twice), program("final_answer(get_price('fig'))")]), own,
                    name="researcher", description="Finds prices of fruit.")
    audit = tmp_path / "audit.jsonl"
    boss = CodeAgent([get_price], ScriptedModel([program("final_answer(researcher(task='prices'))")]),
                     Policy.from_dict(spec), name="manager", managed_agents=[sub], audit=str(audit),
                     shadow=Policy.from_dict(spec))
    with boss:
        result = boss.run("Prices?")
    assert result.status == "done", result.error
    statuses = [r["status"] for r in map(json.loads, audit.read_text().splitlines()) if r["kind"] == "call_outcome"]
    assert statuses.count("denied") == 1, statuses
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [r for r in records if r["kind"] == "shadow_decision"] == []
