"""Durations as people write them (``250ms``, ``120s``, ``5m``, ``1h30m``), for every part of proctor that reads one:
the policy file, a ledger URL's ``?lease=``/``?timeout=``, the inbox approver's ``wait``."""

from __future__ import annotations

import re

__all__ = ["DURATION_PATTERN", "parse_duration"]

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: object) -> float:
    """Parse ``250ms``, ``120s``, ``5m`` or ``1h30m`` into seconds; a bare number is refused (unit unclear).

    Raises ValueError naming the value and the forms it takes."""
    if not isinstance(value, str) or not re.fullmatch(DURATION_PATTERN, value.strip()):
        raise ValueError(f"bad duration {value!r} (write a number and a unit: 250ms, 120s, 5m, 1h30m)")
    return sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(value.strip()))
