"""Policy files as deploys change them, for the reload tests: replaced whole, or flipped between two policies."""

from __future__ import annotations

import os
from pathlib import Path

from proctor.policy import Policy
from proctor.policy.reload import PolicySource


def replace_file(path: Path, text: str) -> None:
    """Replace the file as deploy tools do: a whole new file renamed over the old one."""
    fresh = path.with_suffix(".new")
    fresh.write_text(text)
    os.replace(fresh, path)


class FlippingPolicy(PolicySource):
    """A real policy file renamed over by the other of two policies after each ask, and checked again at once:
    any two asks of it see two policies (a deploy landing between them)."""

    def __init__(self, path: Path, texts: tuple[str, str]) -> None:
        path.write_text(texts[0])
        super().__init__(path, check_every_ms=0)
        self.texts, self.asks = texts, 0

    def current(self) -> Policy:
        policy = super().current()
        self.asks += 1
        replace_file(Path(self.path), self.texts[self.asks % 2])
        self.reload()
        return policy
