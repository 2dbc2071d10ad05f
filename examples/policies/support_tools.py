"""The real tools of `support.yaml`: the support desk of `examples/tools_demo.py` plus a secrets reader.

    proctor policy test examples/policies/support.yaml examples/policies/support.cases.yaml \\
        --tools examples.policies.support_tools
"""

from __future__ import annotations

from examples.tools_demo import (
    add_internal_note,
    close_ticket,
    get_customer,
    get_order,
    get_ticket,
    issue_refund,
    reply_to_customer,
    search_tickets,
    send_email,
)
from proctor import tool

__all__ = ["TOOLS", "read_api_key"]


@tool(side_effect="read")
def read_api_key(service: str = "payments") -> str:
    """Read an API key from the vault (a secret: nothing may leave the run afterwards).

    Args:
        service: Which service's key.
    """
    return f"sk_test_{service}_0000"


TOOLS = [search_tickets, get_ticket, get_order, get_customer, add_internal_note, reply_to_customer, send_email,
         issue_refund, close_ticket, read_api_key]
