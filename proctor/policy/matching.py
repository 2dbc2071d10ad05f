"""`match:` of rules and budgets: which (tool, side-effect class) pairs they concern."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proctor.policy.schema import MatchSpec

__all__ = ["Matcher", "is_glob"]


def is_glob(pattern: str) -> bool:
    """True when `pattern` uses shell-glob syntax (``*``, ``?``, ``[...]``)."""
    return any(c in pattern for c in "*?[")


@dataclass(frozen=True, slots=True)
class Matcher:
    """A compiled `match`: exact tool names, tool globs and side-effect classes (None = any)."""

    names: frozenset[str] | None
    globs: tuple[str, ...]
    side_effects: frozenset[str] | None

    @classmethod
    def from_spec(cls, spec: MatchSpec | None) -> Matcher:
        names: frozenset[str] | None = None
        globs: tuple[str, ...] = ()
        if spec is not None and spec.tool is not None:
            names = frozenset(t for t in spec.tool if not is_glob(t))
            globs = tuple(t for t in spec.tool if is_glob(t))
        side_effects = frozenset(spec.side_effect) if spec is not None and spec.side_effect is not None else None
        return cls(names, globs, side_effects)

    @property
    def any_tool(self) -> bool:
        return self.names is None

    def tool_matches(self, tool: str) -> bool:
        if self.names is None:
            return True
        return tool in self.names or any(fnmatchcase(tool, g) for g in self.globs)

    def side_effect_matches(self, side_effect: str) -> bool:
        return self.side_effects is None or side_effect in self.side_effects

    def matches(self, tool: str, side_effect: str) -> bool:
        return self.side_effect_matches(side_effect) and self.tool_matches(tool)
