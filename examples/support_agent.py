"""A customer-support agent under examples/policies/support.yaml.

    python examples/support_agent.py                                 # scripted model, offline
    python examples/support_agent.py --model openai/gpt-4o-mini       # a real model (OPENAI_API_KEY)
    python examples/support_agent.py --model ollama_chat/qwen2.5-coder:7b

Small refunds go through, the 249 USD one needs a supervisor (you, on a terminal;
refused otherwise), replies on tickets are fine, and customer records are redacted
in the audit log (see the policy's `redact:`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import tools_demo  # next to this script
from rich.console import Console

from proctor.agent import CodeAgent, LiteLLMModel, Model, ScriptedModel
from proctor.agent.render import StepPrinter, summary_table
from proctor.approval import Approver, CallbackApprover, ConsoleApprover
from proctor.policy import Policy
from proctor.telemetry.logging import configure_logging

HERE = Path(__file__).parent
TASK = ("Work through the open support tickets. Refund orders that arrived broken or never arrived, as the "
        "policy allows, reply to each customer on their ticket, and leave an internal note where you could not "
        "help. Answer with what you did per ticket.")

SCRIPT = [
    '''Thought: I read every open ticket and its order.
```python
tickets = {t: get_ticket(t) for t in search_tickets()}
for t in tickets.values():
    order = get_order(t["order_id"])
    print(t["id"], t["subject"], "|", order["item"], order["total"], order["status"])
```''',
    '''Thought: Both deserve a refund; the policy decides which I may do myself.
```python
done = {}
for t in tickets.values():
    order = get_order(t["order_id"])
    try:
        ref = issue_refund(order_id=order["id"], amount=order["total"])
        reply_to_customer(t["id"], f"We refunded {order['total']:.2f} USD for your {order['item']} ({ref}).")
        done[t["id"]] = f"refunded ({ref})"
    except CallRefused as e:
        add_internal_note(t["id"], f"refund of {order['total']:.2f} not done: {e}")
        done[t["id"]] = f"escalated: {type(e).__name__}"
print(done)
```''',
    '''Thought: Done.
```python
final_answer(done)
```''',
]


def approver(console: Console) -> Approver:
    if sys.stdin.isatty():
        return ConsoleApprover(timeout=300)
    console.print("[dim]no terminal: approval requests are refused (run on a terminal to answer them)[/]")
    return CallbackApprover(lambda request: False, name="no-terminal")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a litellm model id (default: a scripted model, offline)")
    parser.add_argument("--audit", default="support-audit.jsonl", help="audit log (default: %(default)s)")
    args = parser.parse_args()

    configure_logging(level="warning")  # library logs: warnings and worse, on stderr
    console = Console(highlight=False)
    model: Model = LiteLLMModel(args.model) if args.model else ScriptedModel(SCRIPT, model_id="scripted-support")
    policy = Policy.from_yaml(HERE / "policies" / "support.yaml")
    tools = [t for t in vars(tools_demo).values() if hasattr(t, "json_schema")]
    printer = StepPrinter(console)
    with CodeAgent(tools, model, policy, approver=approver(console), audit=args.audit, max_steps=10,
                   program_callbacks=[printer.program], step_callbacks=[printer.done]) as agent:
        result = agent.run(TASK, principal="support-bot")
    console.print(summary_table(result, limits={b.name: b.limit.model_dump() for b in policy.budgets}))
    return 0 if result.status == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
