"""Showing a connection URL in a message without the secret in it.

Redis, PostgreSQL and audit URLs reach error messages, `repr`s, logs and the CLI's
"audit log: …" line. A password may sit in the user-info (``postgresql://u:pw@h/db``)
or, as libpq also allows, in the query (``?password=pw``); both are masked here, in
one place, so no caller forgets the second.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["shown_url"]

_SECRET_PARAMS = frozenset({"password", "passwd", "sslpassword"})


def shown_url(url: str, *, query: bool = True) -> str:
    """`url` with every password replaced by ``***``; without its query at all when `query` is false.

    Something that is not a URL (a file path) comes back unchanged.
    """
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.hostname or ""
        if ":" in host:  # an IPv6 literal keeps its brackets
            host = f"[{host}]"
        netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
        parts = parts._replace(netloc=netloc)
    if not query:
        parts = parts._replace(query="")
    elif parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        if any(k.lower() in _SECRET_PARAMS for k, _ in pairs):
            pairs = [(k, "***" if k.lower() in _SECRET_PARAMS else v) for k, v in pairs]
            parts = parts._replace(query=urlencode(pairs, safe="*"))
    return urlunsplit(parts)
