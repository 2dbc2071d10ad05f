"""The embedded demo: a support agent's tools, its policy (``policy.yaml``) and the scripted model's programs."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

__all__ = ["policy_path"]


def policy_path() -> Path:
    """The demo policy file shipped in the package."""
    return Path(str(files("proctor.agent.demo") / "policy.yaml"))
