"""Who may answer an approval, and what an answer proves about who gave it.

A policy names approvers per rule (`approvers: {groups: [sre-leads], not: principal}`) or for every
approval (`approval: {approvers: …}`). An answer comes with an `Answerer`: the name it is recorded
under, how that name was proven (`method`), and the groups the gate or the inbox could learn for it
(from the token file, or from the policy's `approval.os_users` mapping). `refusal()` is the one
check, used where answers are taken (`proctor.approval.answers`) and again where the gate judges them
(`proctor.gate.approval`): it returns the one-line reason an answer is refused, or None.

Data and pure functions (but `os_account`, which reads the password database), so admission stays
pure and every path checks alike.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["METHODS", "PRINCIPAL", "Answerer", "ApproverRule", "OsUser", "os_account", "os_answerer", "refusal",
           "required"]

#: How an answerer's name was proven: an inbox token, an inbox session (a token's login), a trusted
#: proxy's header (`proctor serve --trust-proxy-header`), the OS user
#: the CLI ran as (through the store), the terminal's OS user, a signed webhook answer, the program's
#: own callback, the MCP client's user asked through elicitation (`proctor mcp serve`: the session's principal).
METHODS = ("token", "session", "proxy", "os-user", "console", "webhook-signature", "callback", "mcp-elicitation")
#: The word in `not:` that stands for the run's principal.
PRINCIPAL = "principal"


@dataclass(frozen=True, slots=True)
class ApproverRule:
    """One `approvers:` spec and where it was written (for the refusal's reason)."""

    source: str
    groups: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "groups": list(self.groups), "users": list(self.users),
                "not": list(self.excluded)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ApproverRule:
        def names(key: str) -> tuple[str, ...]:
            value = data.get(key) or ()
            return tuple(str(v) for v in value) if isinstance(value, (list, tuple)) else ()

        return cls(str(data.get("source", "approvers")), names("groups"), names("users"), names("not"))


@dataclass(frozen=True, slots=True)
class OsUser:
    """An OS user of `approval.os_users`: the names it may answer as (`--as`), and its groups."""

    acts_as: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"as": list(self.acts_as), "groups": list(self.groups)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OsUser:
        acts, groups = data.get("as") or (), data.get("groups") or ()
        return cls(tuple(str(a) for a in acts) if isinstance(acts, (list, tuple)) else (),
                   tuple(str(g) for g in groups) if isinstance(groups, (list, tuple)) else ())


@dataclass(frozen=True, slots=True)
class Answerer:
    """Who answered, as proven: `name` is recorded as the approver; `groups` is None when nobody could
    say (a webhook's or a callback's answer, a token file the gate was not told of)."""

    name: str
    method: str
    groups: tuple[str, ...] | None = None
    os_user: str = ""


def os_account() -> str:
    """The effective uid's account name, from the password database (never $USER or $LOGNAME, which
    whoever starts the process sets at will)."""
    import pwd

    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # no passwd entry (a container's arbitrary uid): the uid is still who it is
        return f"uid{uid}"


def required(rules: Sequence[str], by_rule: Mapping[str, ApproverRule | None], asking: Iterable[str],
             default: ApproverRule | None) -> tuple[ApproverRule, ...]:
    """The specs an answer to a call decided by `rules` must meet: each rule among them that asked for
    approval (`asking`) contributes its own, or the policy's `default` when it names none (as does the
    policy's `default: require_approval` when no rule asked)."""
    asked = [name for name in rules if name in set(asking)]
    out: list[ApproverRule] = []
    for name in asked:
        spec = by_rule.get(name)
        if spec is None:
            spec = default
        if spec is not None and spec not in out:
            out.append(spec)
    if not asked and default is not None:
        out.append(default)
    return tuple(out)


def os_answerer(os_user: str, acting_as: str | None, os_users: Mapping[str, OsUser]) -> Answerer | str:
    """The answerer an OS user is (`acting_as`: what `--as` asked for); a str is the refusal's reason."""
    entry = os_users.get(os_user)
    name = acting_as or os_user
    if name != os_user and (entry is None or name not in entry.acts_as):
        return (f"OS user {os_user!r} may not answer as {name!r}: `--as` names only whom the policy's "
                f"approval.os_users.{os_user}.as lists (or leave --as out to answer as {os_user!r})")
    if entry is not None and entry.acts_as and name not in entry.acts_as:
        return (f"OS user {os_user!r} may answer only as {', '.join(entry.acts_as)} "
                f"(the policy's approval.os_users.{os_user}.as)")
    return Answerer(name, "os-user", entry.groups if entry is not None else (), os_user)


def refusal(answerer: Answerer, specs: Sequence[ApproverRule], principal: str | None) -> str | None:
    """Why `answerer` may not answer under `specs` (None: it may). The principal never answers their own
    call where a spec says `not: principal`, by name nor from their own OS account."""
    who = answerer.name
    for spec in specs:
        if PRINCIPAL in spec.excluded and principal is not None and principal in (who, answerer.os_user):
            return f"{who} is the run's principal and may not answer its calls ({spec.source}: not: principal)"
        banned = [n for n in spec.excluded if n != PRINCIPAL and n in (who, answerer.os_user)]
        if banned:
            return f"{who} may not answer this call ({spec.source}: not: {banned[0]})"
        if not spec.groups and not spec.users:
            continue
        if who in spec.users:
            continue
        if spec.groups and answerer.groups is None:
            if answerer.method in ("token", "session", "proxy"):
                return (f"{spec.source} asks for one of the groups {', '.join(spec.groups)} and {who}'s groups "
                        "cannot be checked here: name the inbox's token file in the policy's approval.tokens")
            return (f"{who} answered by {answerer.method}, which proves no groups, and {spec.source} asks for "
                    f"one of the groups {', '.join(spec.groups)}: answer through the inbox or the CLI")
        if not set(spec.groups) & set(answerer.groups or ()):
            needed = " or ".join(filter(None, [
                f"a member of {', '.join(spec.groups)}" if spec.groups else "",
                f"one of {', '.join(spec.users)}" if spec.users else ""]))
            return f"{who} may not answer this call: {spec.source} asks for {needed}"
    return None
