"""A finance agent using native function calling (ToolCallingAgent), under examples/policies/finance.yaml.

    python examples/finance_agent.py                                 # scripted model, offline
    python examples/finance_agent.py --yes                           # approve payments automatically
    python examples/finance_agent.py --model anthropic/claude-3-5-haiku-latest

Reads run freely; every payment needs a person (you, on a terminal; --yes/--no
otherwise); a payment above 10,000 is refused outright; outside production labels
the run is not restricted to the finance team.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from proctor import tool
from proctor.agent import LiteLLMModel, Model, ModelResponse, ScriptedModel, ToolCallingAgent
from proctor.agent.render import StepPrinter, summary_table
from proctor.approval import Approver, CallbackApprover, ConsoleApprover
from proctor.policy import Policy
from proctor.telemetry.logging import configure_logging

HERE = Path(__file__).parent
INVOICES = {
    "INV-881": {"id": "INV-881", "supplier": "Northwind GmbH", "amount": 4200.0, "currency": "EUR",
                "iban": "DE89370400440532013000", "due": "2026-12-01"},
    "INV-882": {"id": "INV-882", "supplier": "Contoso Ltd", "amount": 25000.0, "currency": "GBP",
                "iban": "GB29NWBK60161331926819", "due": "2026-12-03"},
}
PAID: list[str] = []


@tool(side_effect="read")
def get_invoice(invoice_id: str) -> dict[str, Any]:
    """Read an invoice: supplier, amount, currency, IBAN and due date.

    Args:
        invoice_id: The invoice id, e.g. "INV-881".
    """
    return dict(INVOICES[invoice_id])


@tool(side_effect="destructive", cost=10)
def pay_supplier(invoice_id: str, amount: float, currency: str, iban: str) -> str:
    """Pay a supplier invoice by bank transfer; returns the payment id.

    Args:
        invoice_id: The invoice being paid.
        amount: Amount to pay.
        currency: ISO currency code.
        iban: The supplier's IBAN.
    """
    PAID.append(invoice_id)
    return f"PAY-{len(PAID):04d}"


@tool(side_effect="external")
def notify_accounting(to: str, message: str) -> str:
    """Tell accounting what was done.

    Args:
        to: The accounting mailbox.
        message: The message.
    """
    return "notified"


TASK = "Pay the supplier invoices INV-881 and INV-882 that are due this week and tell accounting."

SCRIPT = [
    ModelResponse.calling(("get_invoice", {"invoice_id": "INV-881"}), ("get_invoice", {"invoice_id": "INV-882"})),
    ModelResponse.calling(
        ("pay_supplier", {"invoice_id": "INV-881", "amount": 4200.0, "currency": "EUR",
                          "iban": "DE89370400440532013000"}),
        ("pay_supplier", {"invoice_id": "INV-882", "amount": 25000.0, "currency": "GBP",
                          "iban": "GB29NWBK60161331926819"}),
    ),
    ModelResponse.calling(("notify_accounting", {"to": "accounting@corp.example",
                                                 "message": "INV-881 submitted; INV-882 (25,000 GBP) needs the "
                                                            "treasury desk."})),
    ModelResponse.calling(("final_answer", {"answer": "INV-881 handled as approved; INV-882 refused (over "
                                                      "10,000): treasury desk; accounting notified."})),
]


def approver(console: Console, answer: bool | None) -> Approver:
    if answer is None and sys.stdin.isatty():
        return ConsoleApprover(timeout=300)
    verdict = bool(answer)
    console.print(f"[dim]approval requests are answered automatically: {'approve' if verdict else 'deny'}[/]")
    return CallbackApprover(lambda request: verdict, name="auto-yes" if verdict else "auto-no")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a litellm model id with function calling (default: scripted, offline)")
    parser.add_argument("--audit", default="finance-audit.jsonl", help="audit log (default: %(default)s)")
    answer = parser.add_mutually_exclusive_group()
    answer.add_argument("--yes", dest="answer", action="store_const", const=True, help="approve automatically")
    answer.add_argument("--no", dest="answer", action="store_const", const=False, help="deny automatically")
    args = parser.parse_args()

    configure_logging(level="warning")
    console = Console(highlight=False)
    model: Model = LiteLLMModel(args.model) if args.model else ScriptedModel(SCRIPT, model_id="scripted-finance")
    policy = Policy.from_yaml(HERE / "policies" / "finance.yaml")
    printer = StepPrinter(console)
    with ToolCallingAgent([get_invoice, pay_supplier, notify_accounting], model, policy,
                          approver=approver(console, args.answer), audit=args.audit, max_steps=8,
                          program_callbacks=[printer.program], step_callbacks=[printer.done]) as agent:
        result = agent.run(TASK, principal="controller@finance.corp.example", labels={"env": "staging"})
    console.print(summary_table(result, limits={b.name: b.limit.model_dump() for b in policy.budgets}))
    return 0 if result.status == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
