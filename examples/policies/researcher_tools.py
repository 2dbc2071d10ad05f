"""The real tools of `researcher.yaml` (the researcher's own policy): those of `research.yaml`."""

from __future__ import annotations

from examples.policies.research_tools import TOOLS

__all__ = ["TOOLS"]
