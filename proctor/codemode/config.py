"""``servers.json``: the upstream MCP servers, in the ``mcpServers`` layout MCP clients use.

```json
{"mcpServers": {
  "files":  {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]},
  "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"], "env": {"X": "1"}},
  "tickets": {"url": "https://tickets.internal/mcp", "headers": {"Authorization": "Bearer …"}}
}}
```

Besides the clients' keys (``command``/``args``/``env``/``cwd`` for stdio, ``url``/``headers`` for
streamable HTTP; ``type``/``transport`` are accepted and checked), each server may carry a
``proctor`` object: ``prefix`` (put before its tools' names; default the server's name and ``_``),
``trust_annotations`` (take its tool annotations as side-effect classes; default false),
``timeout`` (seconds to start and list; default 30) and ``call_timeout`` (seconds a call may take).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from proctor.errors import ConfigurationError
from proctor.jsoninput import shape_problem

__all__ = ["ServerConfig", "load_servers"]

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")
_STDIO_KEYS = {"command", "args", "env", "cwd", "type", "transport", "proctor", "disabled"}
_HTTP_KEYS = {"url", "headers", "type", "transport", "proctor", "disabled"}
_PROCTOR_KEYS = {"prefix", "trust_annotations", "timeout", "call_timeout"}


@dataclass(frozen=True)
class ServerConfig:
    """One upstream server."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    prefix: str = ""
    trust_annotations: bool = False
    timeout: float = 30.0
    call_timeout: float | None = None


def load_servers(path: str | Path) -> list[ServerConfig]:
    """The servers of `path`; a `ConfigurationError` naming the file, the server and the fix otherwise."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigurationError(f"{p}: no such file (the upstream MCP servers, as {{\"mcpServers\": {{…}}}})") \
            from None
    except OSError as exc:
        raise ConfigurationError(f"{p}: cannot read it: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigurationError(f"{p}: not UTF-8 (byte {exc.start + 1} of the file); save it as UTF-8") from None
    data = _parse(p, text)
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ConfigurationError(f"{p}: expected an object with \"mcpServers\": {{NAME: {{…}}}}")
    out: list[ServerConfig] = []
    for name, spec in servers.items():
        where = f"{p}: server {name!r}"
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ConfigurationError(f"{where}: a name is a letter, then letters, digits, _ or - (at most 40)")
        if not isinstance(spec, dict):
            raise ConfigurationError(f"{where}: expected an object with \"command\" or \"url\"")
        disabled = spec.get("disabled", False)
        if not isinstance(disabled, bool):
            raise ConfigurationError(f"{where}: \"disabled\" is true or false")
        if disabled:
            continue
        out.append(_server(where, name, spec))
    return out


def _parse(p: Path, text: str) -> Any:
    """The JSON of `text`, refusing what `json.loads` would read as something else: a key written twice in one
    object (it keeps the last copy, a reader sees the first), NaN and Infinity (no JSON number; NaN passes
    every ``<= 0`` check), and nesting deep enough to end in a `RecursionError`."""
    problem = shape_problem(text, str(p))
    if problem is not None:
        raise ConfigurationError(problem)

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ConfigurationError(f"{p}: {json.dumps(key)} twice in one object (JSON keeps only the last; "
                                         "write each key once)")
            out[key] = value
        return out

    def constant(name: str) -> Any:
        raise ConfigurationError(f"{p}: {name} is not a number JSON allows; write seconds as a plain number")

    try:
        return json.loads(text, object_pairs_hook=pairs, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"{p}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}") from None


def _strings(where: str, key: str, value: Any, kind: type) -> Any:
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigurationError(f"{where}: \"{key}\" must be a list of strings")
        return tuple(value)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ConfigurationError(f"{where}: \"{key}\" must be an object of strings")
    return dict(value)


def _server(where: str, name: str, spec: Mapping[str, Any]) -> ServerConfig:
    extra = spec.get("proctor", {})
    if not isinstance(extra, dict) or set(extra) - _PROCTOR_KEYS:
        raise ConfigurationError(f"{where}: \"proctor\" takes {', '.join(sorted(_PROCTOR_KEYS))}")
    prefix = extra.get("prefix", re.sub(r"\W", "_", name) + "_")
    if not isinstance(prefix, str) or (prefix and not prefix.isidentifier()):
        raise ConfigurationError(f"{where}: \"prefix\" must start a Python identifier")
    trust = extra.get("trust_annotations", False)
    if not isinstance(trust, bool):
        raise ConfigurationError(f"{where}: \"trust_annotations\" is true or false")
    timeouts: dict[str, float | None] = {}
    for key, default in (("timeout", 30.0), ("call_timeout", None)):
        value = extra.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ConfigurationError(f"{where}: \"{key}\" is positive seconds")
        timeouts[key] = float(value) if value is not None else None
    base = ServerConfig(name=name, prefix=prefix, trust_annotations=trust, timeout=timeouts["timeout"] or 30.0,
                        call_timeout=timeouts["call_timeout"])
    kind = spec.get("type", spec.get("transport"))
    if "url" in spec:
        unknown = set(spec) - _HTTP_KEYS
        if unknown:
            raise ConfigurationError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} for a URL server")
        url = spec["url"]
        if not isinstance(url, str) or not re.match(r"^https?://", url):
            raise ConfigurationError(f"{where}: \"url\" must be an http:// or https:// URL")
        if kind not in (None, "http", "streamable-http", "streamable_http", "streamableHttp"):
            raise ConfigurationError(f"{where}: transport {kind!r} is not supported (streamable HTTP or stdio)")
        return replace(base, url=url, headers=_strings(where, "headers", spec.get("headers", {}), dict))
    if "command" not in spec:
        raise ConfigurationError(f"{where}: give \"command\" (stdio) or \"url\" (streamable HTTP)")
    unknown = set(spec) - _STDIO_KEYS
    if unknown:
        raise ConfigurationError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} for a stdio server")
    if kind not in (None, "stdio"):
        raise ConfigurationError(f"{where}: transport {kind!r} with \"command\": only stdio starts a command")
    command = spec["command"]
    if not isinstance(command, str) or not command:
        raise ConfigurationError(f"{where}: \"command\" must be a non-empty string")
    cwd = spec.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigurationError(f"{where}: \"cwd\" must be a string")
    env = _strings(where, "env", spec["env"], dict) if "env" in spec else None
    return replace(base, command=command, args=_strings(where, "args", spec.get("args", []), list), env=env, cwd=cwd)
