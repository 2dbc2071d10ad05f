"""Ids by a unique prefix: what the CLI accepts wherever it takes an approval or run id.

Ids are long (``apr_`` and 26 random characters) and the tables print them whole, so a
person can copy one; typing one, any prefix of at least `MIN_PREFIX` characters that names
exactly one id will do. A prefix that names several is refused with the candidates.
"""

from __future__ import annotations

from collections.abc import Iterable

from proctor.errors import AmbiguousId

__all__ = ["MIN_PREFIX", "AmbiguousId", "unique_prefix"]

#: The shortest prefix taken for an id (shorter ones are too likely to name several).
MIN_PREFIX = 6
_SHOWN = 8  # candidates named in a refusal


def unique_prefix(text: str, ids: Iterable[str], what: str) -> str | None:
    """The one id of `ids` that `text` is, or starts with; None when none does.

    `AmbiguousId` names the candidates when several do; a prefix shorter than `MIN_PREFIX`
    that is not itself an id is refused, saying so.
    """
    known = list(dict.fromkeys(ids))
    if text in known:
        return text
    if len(text) < MIN_PREFIX:
        if any(i.startswith(text) for i in known):
            raise AmbiguousId(f"{what} prefix {text!r} is too short: give at least {MIN_PREFIX} characters "
                              "(or the whole id)")
        return None
    found = sorted(i for i in known if i.startswith(text))
    if len(found) > 1:
        named = ", ".join(found[:_SHOWN]) + (f" and {len(found) - _SHOWN} more" if len(found) > _SHOWN else "")
        raise AmbiguousId(f"{what} prefix {text!r} is ambiguous: it starts {named}; give more characters")
    return found[0] if found else None
