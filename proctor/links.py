"""The links a text carries: what `links(text)` gives a policy.

A message body, a post or a page holds links inside prose, and `provenance()` or `from_user()`
read an argument whole: "every link in this mail came from the user" needs the links one by
one (`links(args.body).all(u, from_user(u))`). A link here is what a mail client or a chat
makes clickable, so that what the reader can follow is what the policy checks:

- a URL with a scheme (``https://…``, ``ftp://…``, any ``scheme://``);
- a host starting ``www.``, with or without a path;
- a bare host name (``login-check-42.com``) followed by a path, a port or a query, or whose
  last label is a common top-level domain (`COMMON_TLDS`) — ``report.pdf`` and ``setup.py``
  are file names, not links, and a bare name with a rare top-level domain is only a link with
  a path after it.

The domain of an e-mail address is not a link (``mark@gmail.com``). Punctuation that ends a
sentence is not part of a link (``…/page).``), nor is a next sentence glued to it without a
space (``www.our-company.com.They``, as the provenance tokenisers read it), while a host's own
labels stay (``example.com.au``). Links come back as written, in order, each once.
"""

from __future__ import annotations

import re

__all__ = ["COMMON_TLDS", "links_in"]

#: Top-level domains a bare host name (no scheme, no ``www.``, no path) is read as a link with.
COMMON_TLDS = frozenset(
    "com net org info biz io co app dev ai me xyz online site shop store top tech cloud link live "
    "news blog page world club pro email click "
    "uk de fr es it nl be ch at se no dk fi pl cz pt ie ru ua cn jp kr in au nz ca us br mx ar eu".split())

_STOP = r"\s<>\"'`"
_LINK = re.compile(
    # A scheme, or www.: the rest up to a space or a quote.
    rf"(?<![\w@.+-])(?:[a-z][a-z0-9+.-]*://|www\.)[^{_STOP}]+"
    # A bare host: labels, a top-level domain, then optionally a port and a path, query or fragment.
    # (Labels of any script: a look-alike host is a link too, and not the user's.)
    rf"|(?<![\w@.+/:-])(?P<host>(?:[^\W_](?:[\w-]{{0,61}}[^\W_])?\.)+(?P<tld>[^\W\d_]{{2,63}}))"
    rf"(?![\w@-])(?P<rest>(?::\d+)?(?:[/?#][^{_STOP}]*)?)",
    re.IGNORECASE)
_TRAILING = ".,;:!?'\""
_CLOSERS = {")": "(", "]": "[", "}": "{", ">": "<"}
#: A next sentence glued to a host or path by a full stop: a capital and lower-case letters to the end.
_GLUED = re.compile(r"^(.*[a-z0-9/]\.[a-z]{2,63}(?:[/?#].*)?)\.[A-Z][a-z]*$", re.DOTALL)


def _trimmed(link: str) -> str:
    """`link` without the punctuation that ends the sentence around it (a closing bracket stays when the
    link opened one: ``…/Rust_(language)``)."""
    while link:
        last = link[-1]
        if last in _TRAILING:
            link = link[:-1]
        elif last in _CLOSERS and link.count(_CLOSERS[last]) < link.count(last):
            link = link[:-1]
        else:
            break
    glued = _GLUED.match(link)
    return glued.group(1) if glued is not None else link


def links_in(text: str) -> list[str]:
    """The links of `text` (module docstring), as written, in order of first appearance, each once."""
    found: list[str] = []
    seen: set[str] = set()
    for match in _LINK.finditer(text):
        host, tld = match.group("host"), match.group("tld")
        if host is None:
            link = _trimmed(match.group(0))
        elif match.group("rest"):
            link = _trimmed(match.group(0))
        elif tld.lower() in COMMON_TLDS:
            link = host
        else:
            # ``our-company.com.They``: the last "label" is the next sentence when it is a capitalised word and
            # what comes before it is a host of its own.
            head, _, last = host.rpartition(".")
            if not (last[:1].isupper() and last[1:].islower() and "." in head
                    and head.rpartition(".")[2].lower() in COMMON_TLDS):
                continue
            link = head
        if link.lower().rstrip("/") in ("www", "www.") or link.endswith("://"):
            continue  # (a bare "www." or scheme, once trimmed)
        if link not in seen:
            seen.add(link)
            found.append(link)
    return found
