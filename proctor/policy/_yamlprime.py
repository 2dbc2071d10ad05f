"""Spare PyYAML's import its costliest step: a regex over all of Unicode (a start-up workaround).

``yaml.reader.Reader.NON_PRINTABLE`` is compiled when yaml is imported, from a negated character
class whose ranges reach U+10FFFF; Python's regex compiler walks them in Python: 58 M instructions,
an eighth of `proctor policy check`. The characters it matches are few (C0 controls but tab, LF,
CR; DEL to U+0084; U+0086-U+009F; surrogates; U+FFFE and U+FFFF), and the class listing them
compiles in 5 M. `prime` puts that equivalent pattern in the `re` module's cache under yaml's
pattern, so yaml's ``re.compile`` finds it there. The two match exactly the same characters (every
code point is tested); only the pattern's text differs. If yaml is already imported, or `re`
keeps no such cache (another Python), nothing changes and yaml compiles its own.
"""

from __future__ import annotations

import re
import sys

__all__ = ["EQUIVALENT", "NON_PRINTABLE", "prime"]

#: PyYAML's pattern, exactly as yaml/reader.py writes it.
NON_PRINTABLE = "[^\x09\x0A\x0D\x20-\x7E\x85\xA0-\uD7FF\uE000-\uFFFD\U00010000-\U0010ffff]"
#: The same set of characters, listed instead of excluded.
EQUIVALENT = "[\x00-\x08\x0B\x0C\x0E-\x1F\x7F-\x84\x86-\x9F\uD800-\uDFFF\uFFFE\uFFFF]"


def prime() -> None:
    """Cache the equivalent pattern under yaml's before yaml is imported (idempotent)."""
    cache = getattr(re, "_cache", None)
    if "yaml" in sys.modules or not isinstance(cache, dict):
        return
    cache.setdefault((str, NON_PRINTABLE, 0), re.compile(EQUIVALENT))
