"""The demo's tools: a small in-memory shop (orders, refunds, an outbox). Nothing leaves the process."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proctor.tools import Tool, tool

__all__ = ["CUSTOMER", "Shop", "make_tools"]

CUSTOMER = "dana.kim@example.net"

_RECENT = [
    ("A-1038", "delivered", 18.90, "ok"),
    ("A-1041", "delivered", 42.50, "arrived damaged"),
    ("A-1057", "delivered", 240.00, "arrived damaged"),
    ("A-1063", "in transit", 12.00, ""),
]
_ARCHIVED = [(f"A-09{n:02d}", "delivered", 10.0 + 3 * n, "ok") for n in range(1, 13)]


@dataclass
class Shop:
    """The state the tools act on; inspect it after a run to see what really happened."""

    orders: dict[str, dict[str, Any]] = field(default_factory=dict)
    refunds: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def sample(cls) -> Shop:
        shop = cls()
        for archived, rows in ((False, _RECENT), (True, _ARCHIVED)):
            for oid, status, total, note in rows:
                shop.orders[oid] = {"id": oid, "customer": CUSTOMER, "status": status, "total": total,
                                    "note": note, "archived": archived}
        return shop


def make_tools(shop: Shop) -> list[Tool]:
    """The four support tools, bound to `shop`."""

    @tool(side_effect="read")
    def find_orders(customer: str, include_archived: bool = False) -> list[str]:
        """List a customer's order ids, newest first.

        Args:
            customer: The customer's email address.
            include_archived: Also list orders older than 90 days.
        """
        ids = [o["id"] for o in shop.orders.values()
               if o["customer"] == customer and (include_archived or not o["archived"])]
        return sorted(ids, reverse=True)

    @tool(side_effect="read")
    def get_order(order_id: str) -> dict[str, Any]:
        """Look up one order: id, status, total (USD) and the customer's note.

        Args:
            order_id: The order id, e.g. "A-1041".
        """
        if order_id not in shop.orders:
            raise KeyError(f"no order {order_id}")
        order = shop.orders[order_id]
        return {k: order[k] for k in ("id", "status", "total", "note")}

    @tool(side_effect="destructive", cost=5)
    def issue_refund(order_id: str, amount: float, reason: str) -> str:
        """Refund an order to the customer's original payment method; returns the refund id.

        Args:
            order_id: The order to refund.
            amount: Amount in USD.
            reason: Why, in a few words (shown to the customer).
        """
        refund_id = f"RF-{len(shop.refunds) + 7301}"
        shop.refunds.append({"id": refund_id, "order_id": order_id, "amount": amount, "reason": reason})
        return refund_id

    @tool(side_effect="external", cost=1)
    def send_email(to: str, subject: str, body: str) -> str:
        """Send an email; returns the message id.

        Args:
            to: Recipient address.
            subject: Subject line.
            body: Plain-text body.
        """
        shop.outbox.append({"to": to, "subject": subject, "body": body})
        return f"msg-{len(shop.outbox):04d}"

    return [find_orders, get_order, issue_refund, send_email]
