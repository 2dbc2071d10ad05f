"""What a worker is told when it starts: its tools as data (never functions) and its rlimits."""

from __future__ import annotations

import inspect
import keyword
import os
import sys
from typing import Any

from proctor.interpreter.channel import EncodeError, encode_value
from proctor.tools import Tool

__all__ = ["STDLIB", "limits_for", "tool_spec"]

#: Top-level module names that never need the site-packages bind.
STDLIB = frozenset({"*"}) | frozenset(getattr(sys, "stdlib_module_names", ()))


def tool_spec(t: Tool, *, final: bool = False) -> dict[str, Any]:
    """The data a worker builds a stub from: name, parameters, docstring — never the function.

    Only the `final` tool (the one `final_answer()` calls, see `Interpreter(final_answer=…)`) may be
    named ``final_answer``."""
    if keyword.iskeyword(t.name) or (t.name == "final_answer") is not final:
        raise ValueError(f"a tool cannot be named {t.name!r} in a program")
    params = []
    for p in t.signature.parameters.values():
        if p.name.startswith("_proctor_"):
            raise ValueError(f"tool {t.name!r}: parameter names starting with '_proctor_' are reserved")
        spec: dict[str, Any] = {"name": p.name, "kind": p.kind.name}
        if p.default is not p.empty:
            try:
                spec["default"] = encode_value(p.default)
            except EncodeError:
                spec["optional"] = True
        params.append(spec)
    annotations = {p.name: _annotation(p.annotation) for p in t.signature.parameters.values()
                   if p.annotation is not p.empty}
    if t.signature.return_annotation is not t.signature.empty:
        annotations["return"] = _annotation(t.signature.return_annotation)
    args = "".join(f"\n    {k}: {v}" for k, v in t.arg_descriptions.items())
    return {"name": t.name, "params": params, "annotations": annotations,
            "doc": t.description + (f"\n\nArgs:{args}" if args else "")}


def _annotation(annotation: Any) -> str:
    """An annotation as text (already text under ``from __future__ import annotations``)."""
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def limits_for(isolation: str, memory: int | None, cpu: int, nproc: int, fsize: int) -> dict[str, int]:
    limits = {"RLIMIT_CPU": int(cpu), "RLIMIT_FSIZE": int(fsize), "RLIMIT_CORE": 0, "RLIMIT_NOFILE": 256}
    if memory:
        limits["RLIMIT_AS"] = int(memory)
    if isolation == "bwrap" or os.geteuid() == 0:
        # Under bwrap the count is per user namespace (this sandbox only); for root the kernel ignores
        # RLIMIT_NPROC, and the sandbox's seccomp filter refuses new processes instead.
        limits["RLIMIT_NPROC"] = int(nproc)
    else:
        limits["RLIMIT_NPROC"] = _tasks_of(os.getuid()) + int(nproc)  # counted machine-wide per uid
    return limits


def _tasks_of(uid: int) -> int:
    """Threads the user already runs (RLIMIT_NPROC counts them all, machine-wide)."""
    total = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 4096
    for pid in entries:
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
                status = fh.read()
        except OSError:
            continue
        fields: dict[str, str] = {}
        for line in status.splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            total += int(fields.get("Threads", "1") or 1)
    return total
