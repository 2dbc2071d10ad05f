"""The real tools of `finance.yaml` (in memory: nothing leaves the process).

    proctor policy test examples/policies/finance.yaml examples/policies/finance.cases.yaml \\
        --tools examples.policies.finance_tools
"""

from __future__ import annotations

from typing import Any

from proctor import tool

__all__ = ["TOOLS"]

INVOICES = {"INV-7": {"id": "INV-7", "supplier": "Acme GmbH", "amount": 900.0, "currency": "EUR"}}


@tool(side_effect="read")
def get_invoice(invoice_id: str) -> dict[str, Any]:
    """Read one invoice: supplier, amount, currency.

    Args:
        invoice_id: The invoice id, e.g. "INV-7".
    """
    return dict(INVOICES.get(invoice_id, {"id": invoice_id, "supplier": "unknown", "amount": 0.0,
                                          "currency": "EUR"}))


@tool(side_effect="read")
def list_transactions(account: str = "main", limit: int = 50) -> list[dict[str, Any]]:
    """The latest transactions of an account.

    Args:
        account: The account name.
        limit: How many, newest first.
    """
    return [{"account": account, "amount": 10.0 * i} for i in range(min(limit, 3))]


@tool(side_effect="read")
def get_fx_rate(base: str, quote: str) -> float:
    """An exchange rate.

    Args:
        base: Currency sold, e.g. "EUR".
        quote: Currency bought, e.g. "USD".
    """
    return 1.0 if base == quote else 1.1


@tool(side_effect="write")
def reconcile(invoice_id: str, transaction_id: str | None = None) -> str:
    """Mark an invoice as matched to a transaction.

    Args:
        invoice_id: The invoice.
        transaction_id: The bank transaction that paid it, if known.
    """
    return f"{invoice_id} reconciled"


@tool(side_effect="destructive", cost=10)
def charge_card(card_number: str, cvv: str, amount: float, currency: str = "EUR") -> str:
    """Charge a customer's card.

    Args:
        card_number: The card number.
        cvv: The card's security code.
        amount: How much.
        currency: ISO currency code.
    """
    return f"charged {amount} {currency}"


@tool(side_effect="destructive", cost=10)
def pay_supplier(iban: str, amount: float, currency: str = "EUR", invoice_id: str | None = None) -> str:
    """Pay a supplier by bank transfer.

    Args:
        iban: The supplier's IBAN.
        amount: How much.
        currency: ISO currency code.
        invoice_id: The invoice paid, if any.
    """
    return f"paid {amount} {currency}"


@tool(side_effect="destructive", cost=5)
def refund_charge(charge_id: str, amount: float) -> str:
    """Refund (part of) an earlier card charge.

    Args:
        charge_id: The charge to refund.
        amount: How much.
    """
    return f"refunded {amount}"


@tool(side_effect="external")
def notify_accounting(to: str, message: str) -> str:
    """Tell accounting what was done.

    Args:
        to: The accounting mailbox.
        message: The message.
    """
    return "notified"


TOOLS = [get_invoice, list_transactions, get_fx_rate, reconcile, charge_card, pay_supplier, refund_charge,
         notify_accounting]
