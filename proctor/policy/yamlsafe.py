"""Limits every YAML document proctor reads is held to, checked before anything is built.

Policies and cases files are parsed by one loader (`proctor.policy.loader.compose_marked`),
and it calls `check_yaml` first. A YAML alias is a pointer, so a few hundred bytes of
nested anchors (``x1: &a1 [*a0, *a0, …]``, nine levels) describe billions of nodes once
expanded — the "billion laughs". `check_yaml` walks the event stream once (PyYAML's
parser is iterative: no recursion, memory bounded by the nesting depth) and counts
the size each node would have when expanded, so a bomb is refused at the alias that
crosses the limit, with its line and column, in milliseconds and without building it.

| limit | default | what it bounds |
|---|---|---|
| `MAX_YAML_BYTES` | 4 MiB | the document's size in UTF-8 bytes |
| `MAX_YAML_NODES` | 200,000 | nodes after expanding every alias |
| `MAX_YAML_SCALAR_CHARS` | 32 Mi | characters of scalars after expanding every alias |
| `MAX_YAML_DEPTH` | 64 | nesting of sequences and mappings |
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import yaml

from proctor.errors import PolicyError, PolicyIssue

__all__ = [
    "MAX_YAML_BYTES",
    "MAX_YAML_DEPTH",
    "MAX_YAML_NODES",
    "MAX_YAML_SCALAR_CHARS",
    "YamlLimits",
    "check_yaml",
    "read_yaml_file",
]

MAX_YAML_BYTES = 4 << 20
MAX_YAML_NODES = 200_000
MAX_YAML_SCALAR_CHARS = 32 << 20
MAX_YAML_DEPTH = 64

# libyaml's parser when PyYAML was built with it (much faster); the pure-Python one otherwise.
_Loader: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True, slots=True)
class YamlLimits:
    """The limits `check_yaml` applies (the module defaults unless a caller passes others)."""

    max_bytes: int = MAX_YAML_BYTES
    max_nodes: int = MAX_YAML_NODES
    max_scalar_chars: int = MAX_YAML_SCALAR_CHARS
    max_depth: int = MAX_YAML_DEPTH


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of character `index` of `text`."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def read_yaml_file(path: str | os.PathLike[str], what: str = "file", limits: YamlLimits | None = None, *,
                   regular_only: bool = False) -> str:
    """Read a YAML file as UTF-8, reading no more than the size limit; raise a located `PolicyError`.

    `regular_only` refuses anything but a regular file (a FIFO, a device, through a symlink too) without
    blocking on it: what a file read again and again (a reloading policy) must be. Otherwise a pipe is read
    as given (``proctor policy check <(…)``)."""
    lim = limits or YamlLimits()
    source = os.fspath(path)
    try:
        if regular_only:  # refused before it is opened (opening a device may do something of its own)
            _regular(os.stat(path).st_mode, source, what)
        # O_NONBLOCK: opening a FIFO no process writes to returns at once (it changes nothing for a file);
        # O_NOCTTY: a terminal at the path does not become the process's controlling terminal.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | (os.O_NONBLOCK if regular_only else 0))
        try:
            if regular_only:  # what was opened, in case the path changed since the stat
                _regular(os.fstat(fd).st_mode, source, what)
            f = open(fd, "rb")  # (a directory fails here, leaving the descriptor to us)
        except BaseException:
            os.close(fd)
            raise
        with f:
            data = f.read(lim.max_bytes + 1)
    except OSError as exc:
        raise PolicyError(PolicyIssue(source, 1, 1, f"cannot read {what}: {exc.strerror or exc}")) from None
    if len(data) > lim.max_bytes:
        head = data[: lim.max_bytes].decode("utf-8", "replace")
        raise PolicyError(PolicyIssue(source, *_position(head, len(head)),
                                      f"file over the {lim.max_bytes}-byte limit for YAML documents; "
                                      "split it or shorten it"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[: exc.start].decode("utf-8", "replace")
        line, col = _position(before, len(before))
        message = f"not UTF-8 (byte {exc.start}); save the file as UTF-8"
        raise PolicyError(PolicyIssue(source, line, col, message)) from None


def _regular(mode: int, source: str, what: str) -> None:
    if not stat.S_ISREG(mode):
        raise PolicyError(PolicyIssue(source, 1, 1, f"cannot read {what}: {_kind(mode)}, not a regular file "
                                                    f"(a {what} that is reloaded is read from a file)"))


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "something else"


def check_yaml(text: str, source: str, limits: YamlLimits | None = None) -> list[PolicyIssue]:
    """Return the issue (at most one, located) if `text` is over a limit when expanded; [] if within.

    A document that is not valid YAML yields [] here: the composer reports it with
    its own message. Runs in time linear in `text` and memory bounded by its depth
    and its number of anchors.
    """
    lim = limits or YamlLimits()
    if len(text) > lim.max_bytes or (len(text) * 4 > lim.max_bytes and len(text.encode("utf-8")) > lim.max_bytes):
        head = text.encode("utf-8")[: lim.max_bytes].decode("utf-8", "ignore")
        return [PolicyIssue(source, *_position(text, len(head)),
                            f"document over the {lim.max_bytes}-byte limit for YAML documents")]
    try:
        return _check(text, source, lim, _Loader)
    except yaml.YAMLError:
        # libyaml scans ahead and stops at its own limits (e.g. 1000 levels of flow nesting)
        # before yielding the events that would locate the problem; PyYAML's parser does not.
        try:
            return _check(text, source, lim, yaml.SafeLoader)
        except yaml.YAMLError:
            return []  # not YAML: the composer reports it where it is


def _check(text: str, source: str, lim: YamlLimits, loader: type) -> list[PolicyIssue]:
    sizes: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, scalar chars) when expanded
    stack: list[_Open] = []  # the collections open at this point of the stream
    total = _Open(0, 0, None)

    def add(n: int, c: int, event: yaml.Event) -> PolicyIssue | None:
        for counter in (total, stack[-1]) if stack else (total,):
            counter.nodes += n
            counter.chars += c
        line, col = _at(event)
        if total.nodes > lim.max_nodes:
            return PolicyIssue(source, line, col, f"YAML expands to more than {lim.max_nodes} nodes "
                               "(aliases repeating anchors: an alias bomb?); write the data out or shorten it")
        if total.chars > lim.max_scalar_chars:
            return PolicyIssue(source, line, col, f"YAML expands to more than {lim.max_scalar_chars} characters "
                               "of scalars (aliases repeating long anchors?); write the data out or shorten it")
        return None

    for event in yaml.parse(text, Loader=loader):
        problem: PolicyIssue | None = None
        where = _at(event)
        if isinstance(event, yaml.AliasEvent):
            # An alias of an anchor still open (recursive) or undefined counts as one node:
            # the loader reports those itself.
            anchor = str(event.anchor)
            open_here = any(o.anchor == anchor for o in stack)
            problem = add(*((1, 0) if open_here else sizes.get(anchor, (1, 0))), event)
        elif isinstance(event, yaml.ScalarEvent):
            problem = add(1, len(event.value), event)
            if event.anchor is not None:
                sizes[str(event.anchor)] = (1, len(event.value))
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(stack) >= lim.max_depth:
                return [PolicyIssue(source, *where, f"YAML nested deeper than {lim.max_depth} levels")]
            problem = add(1, 0, event)
            stack.append(_Open(1, 0, None if event.anchor is None else str(event.anchor)))
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            done = stack.pop()
            if done.anchor is not None:
                sizes[done.anchor] = (done.nodes, done.chars)
            if stack:  # its own node was counted into the parent at its start; add its contents
                stack[-1].nodes += done.nodes - 1
                stack[-1].chars += done.chars
        if problem is not None:
            return [problem]
    return []


def _at(event: yaml.Event) -> tuple[int, int]:
    mark = event.start_mark
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


@dataclass(slots=True)
class _Open:
    """Expanded size so far of an open collection (or of the whole document)."""

    nodes: int
    chars: int
    anchor: str | None
