"""The fleet example's tools (stand-ins: replace their bodies with your systems' calls)."""

from __future__ import annotations

from proctor import tool


@tool(side_effect="read")
def get_balance(account: str) -> int:
    """The balance of an account, in cents.

    Args:
        account: Account id.
    """
    return 1_000_000


@tool(side_effect="external", cost=1)
def send_email(to: str, subject: str, body: str) -> str:
    """Send an email.

    Args:
        to: Recipient address.
        subject: Subject line.
        body: Plain-text body.
    """
    return f"sent to {to}"


@tool(side_effect="destructive")
def wire_transfer(account: str, amount: int) -> str:
    """Wire money to an account.

    Args:
        account: Destination account.
        amount: Amount in currency units.
    """
    return f"wired {amount} to {account}"
