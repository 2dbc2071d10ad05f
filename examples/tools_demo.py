"""Support-desk tools for `proctor run` and the examples: an in-memory helpdesk, nothing leaves the process.

Their names match `examples/policies/support.yaml`, so:

    proctor run "Handle ticket T-100" --tools examples.tools_demo \\
        --policy examples/policies/support.yaml --model openai/gpt-4o-mini

`MOD` alone takes every `@tool` function of the module.
"""

from __future__ import annotations

from typing import Any

from proctor import tool

TICKETS: dict[str, dict[str, Any]] = {
    "T-100": {"id": "T-100", "customer": "C-7", "order_id": "O-1", "status": "open",
              "subject": "Parcel arrived crushed", "body": "The mug inside is broken. Can I get my money back?"},
    "T-101": {"id": "T-101", "customer": "C-9", "order_id": "O-2", "status": "open",
              "subject": "Never arrived", "body": "My espresso machine never came. It was 249.00."},
}
ORDERS: dict[str, dict[str, Any]] = {
    "O-1": {"id": "O-1", "customer": "C-7", "item": "mug", "total": 19.99, "status": "delivered"},
    "O-2": {"id": "O-2", "customer": "C-9", "item": "espresso machine", "total": 249.00, "status": "lost"},
}
CUSTOMERS: dict[str, dict[str, Any]] = {
    "C-7": {"id": "C-7", "name": "Jane Roe", "email": "jane@gmail.example", "phone": "+1 555 0100",
            "address": {"street": "1 Elm St", "city": "Springfield"}},
    "C-9": {"id": "C-9", "name": "Li Wei", "email": "li.wei@mail.example", "phone": "+1 555 0199",
            "address": {"street": "9 Oak Ave", "city": "Shelbyville"}},
}
SENT: list[dict[str, Any]] = []  # replies, mails and refunds that "happened"


@tool(side_effect="read")
def search_tickets(status: str = "open") -> list[str]:
    """List ticket ids with a given status.

    Args:
        status: open or closed.
    """
    return [t["id"] for t in TICKETS.values() if t["status"] == status]


@tool(side_effect="read")
def get_ticket(ticket_id: str) -> dict[str, Any]:
    """Read one ticket: customer id, order id, subject and body.

    Args:
        ticket_id: The ticket id, e.g. "T-100".
    """
    return dict(TICKETS[ticket_id])


@tool(side_effect="read")
def get_order(order_id: str) -> dict[str, Any]:
    """Read one order: item, total (USD) and delivery status.

    Args:
        order_id: The order id, e.g. "O-1".
    """
    return dict(ORDERS[order_id])


@tool(side_effect="read")
def get_customer(customer_id: str) -> dict[str, Any]:
    """Read a customer's record (name, email, phone, address).

    Args:
        customer_id: The customer id, e.g. "C-7".
    """
    return dict(CUSTOMERS[customer_id])


@tool(side_effect="write")
def add_internal_note(ticket_id: str, note: str) -> str:
    """Add a note on a ticket that only staff can see.

    Args:
        ticket_id: The ticket.
        note: The note.
    """
    TICKETS[ticket_id].setdefault("notes", []).append(note)
    return "noted"


@tool(side_effect="external", cost=1)
def reply_to_customer(ticket_id: str, body: str, attachments: tuple[str, ...] = ()) -> str:
    """Reply to the customer on their ticket.

    Args:
        ticket_id: The ticket to answer.
        body: The reply.
        attachments: File names to attach, if any.
    """
    SENT.append({"kind": "reply", "ticket_id": ticket_id, "body": body, "attachments": list(attachments)})
    return f"reply sent on {ticket_id}"


@tool(side_effect="external", cost=1)
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email.

    Args:
        to: Recipient address.
        subject: Subject line.
        body: Plain-text body.
    """
    SENT.append({"kind": "email", "to": to, "subject": subject, "body": body})
    return f"mail to {to} queued"


@tool(side_effect="destructive", cost=5)
def issue_refund(order_id: str, amount: float) -> str:
    """Refund an order to the original payment method; returns the refund id.

    Args:
        order_id: The order to refund.
        amount: Amount in USD.
    """
    SENT.append({"kind": "refund", "order_id": order_id, "amount": amount})
    return f"RF-{len(SENT):04d}"


@tool(side_effect="write")
def close_ticket(ticket_id: str) -> str:
    """Close a ticket.

    Args:
        ticket_id: The ticket to close.
    """
    TICKETS[ticket_id]["status"] = "closed"
    return f"{ticket_id} closed"
