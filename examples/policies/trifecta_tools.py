"""The real tools of `trifecta.yaml`: a browser, a mailbox, files and two ways out (all in memory).

    proctor policy test examples/policies/trifecta.yaml examples/policies/trifecta.cases.yaml \\
        --tools examples.policies.trifecta_tools
"""

from __future__ import annotations

from typing import Any

from proctor import tool

__all__ = ["TOOLS"]

SENT: list[dict[str, Any]] = []


@tool(side_effect="read")
def fetch_url(url: str, max_bytes: int = 100_000) -> str:
    """Fetch a web page as text (untrusted: anyone can write a web page).

    Args:
        url: The address.
        max_bytes: Truncate the page after this many bytes.
    """
    return f"<html>the page at {url}</html>"[:max_bytes]


@tool(side_effect="read")
def search_web(query: str, results: int = 5) -> list[str]:
    """Search the web; returns result snippets (untrusted).

    Args:
        query: What to search for.
        results: How many results.
    """
    return [f"result {i} for {query}" for i in range(results)]


@tool(side_effect="read")
def read_inbox(folder: str = "inbox", unread_only: bool = True) -> list[dict[str, str]]:
    """Read the user's mail (private).

    Args:
        folder: Which folder.
        unread_only: Only unread messages.
    """
    return [{"from": "bank@bank.example", "subject": "Your statement", "folder": folder}]


@tool(side_effect="read")
def read_file(path: str) -> str:
    """Read one of the user's files (private).

    Args:
        path: The file's path.
    """
    return f"contents of {path}"


@tool(side_effect="none")
def summarize(text: str, words: int = 50) -> str:
    """Summarise a text.

    Args:
        text: The text.
        words: About how many words.
    """
    return " ".join(text.split()[:words])


@tool(side_effect="write")
def draft_reply(to: str, body: str) -> str:
    """Save a draft (nothing is sent).

    Args:
        to: Recipient.
        body: Text.
    """
    return "draft saved"


@tool(side_effect="external", cost=1)
def send_email(to: str, subject: str, body: str) -> str:
    """Send an e-mail.

    Args:
        to: Recipient address.
        subject: Subject line.
        body: Plain-text body.
    """
    SENT.append({"to": to, "subject": subject, "body": body})
    return f"sent to {to}"


@tool(side_effect="external")
def post_webhook(url: str, payload: dict[str, Any] | None = None) -> str:
    """POST a JSON payload to a URL.

    Args:
        url: Where to.
        payload: The JSON body.
    """
    return f"posted to {url}"


TOOLS = [fetch_url, search_web, read_inbox, read_file, summarize, draft_reply, send_email, post_webhook]
