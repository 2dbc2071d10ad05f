"""Showing a connection URL in a message without the secret in it.

Redis, PostgreSQL and audit URLs reach error messages, `repr`s, logs and the CLI's
"audit log: …" line. A password may sit in the user-info (``postgresql://u:pw@h/db``)
or, as libpq also allows, in the query (``?password=pw``); both are masked here, in
one place, so no caller forgets the second.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from proctor.errors import StoreError

__all__ = ["DEFAULT_NAMESPACE", "LEDGER_OPTIONS", "redis_halts_url", "shown_url", "split_ledger_options",
           "sqlite_path"]

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


#: The query options a Redis ledger URL may carry that are proctor's, not redis-py's.
LEDGER_OPTIONS = ("lease", "timeout", "prefix")


def split_ledger_options(url: str) -> tuple[str, dict[str, str]]:
    """A Redis ledger URL as redis-py takes it, and proctor's own options (`LEDGER_OPTIONS`) taken out of
    its query: ``redis://h/0?timeout=2s`` is ``("redis://h/0", {"timeout": "2s"})``. The ledger and the
    halts kept beside it (`proctor halt --ledger URL`) read a URL the same way."""
    base, _, query = url.partition("?")
    ours, theirs = {}, []
    for k, v in parse_qsl(query, keep_blank_values=True):
        if k in LEDGER_OPTIONS:
            ours[k] = v
        else:
            theirs.append((k, v))
    return base + ("?" + urlencode(theirs) if theirs else ""), ours


#: The key namespace of a Redis ledger given no ``prefix=`` (its halts live under ``proctor:halts``).
DEFAULT_NAMESPACE = "proctor"


def redis_halts_url(target: str, namespace: str | None) -> str:
    """Where the halts beside a Redis ledger are (`proctor.halt.HaltsAt`): the Redis `target` (redis-py's URL), with
    ``prefix=`` kept when the ledger's key `namespace` is not the default, so fleets sharing one Redis under their
    own prefixes keep their own halts as they keep their own budgets."""
    if not namespace or namespace == DEFAULT_NAMESPACE:
        return target
    return target + ("&" if "?" in target else "?") + urlencode({"prefix": namespace})


def sqlite_path(url: str) -> str:
    """``sqlite:///runs.db`` is relative, ``sqlite:////var/runs.db`` absolute (as SQLAlchemy spells them)."""
    if url.startswith("sqlite:"):
        if not url.startswith("sqlite:///"):
            raise StoreError(f"{url!r}: write sqlite:///relative/path.db or sqlite:////absolute/path.db")
        path = url[len("sqlite:///"):]
    else:
        path = url
    if not path or path == ":memory:":
        raise StoreError(f"{url!r}: a run store must be a file other processes can open (sqlite:///runs.db)")
    return path
