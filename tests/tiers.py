"""The test tiers: their markers, and hypothesis example counts per tier.

`make check` leaves out every test carrying one of `TIERS` (tests/conftest.py gives the markers);
`make test` runs them all.

`make test` runs every property test with the examples it names; `make check` (the fast inner loop)
loads the "check" profile (registered in tests/conftest.py), under which `examples(n)` is a tenth of
them — at least 10, never more than `n`. A test writes ``@settings(max_examples=examples(500))``,
so its full count stays written where it is, and a test without ``max_examples`` gets the profile's.
"""

from __future__ import annotations

from hypothesis import settings

#: The markers of the tests `make check` leaves out (registered in pyproject.toml, given in tests/conftest.py).
TIERS = ("server", "browser", "sandbox", "process")
#: Hypothesis' own default count: the full suite's profile.
FULL_EXAMPLES = 100
#: `make check`'s profile: a tenth of hypothesis' default, and a tenth of each test's own count.
CHECK_PROFILE = settings(max_examples=FULL_EXAMPLES // 10)


def examples(n: int, profile: settings | None = None) -> int:
    """`n` under the full profile; scaled down as `profile`'s count is (default: the active profile's)."""
    share = (profile or settings.default).max_examples / FULL_EXAMPLES
    if share >= 1:
        return n
    return min(n, max(CHECK_PROFILE.max_examples, int(n * share)))
