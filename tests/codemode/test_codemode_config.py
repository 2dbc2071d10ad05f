"""`servers.json` as people write it: a malformed file is refused with a located error naming the fix, never
read as something else (the last of two same keys, NaN seconds) and never a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proctor.codemode.config import load_servers
from proctor.errors import ConfigurationError


def _refused(tmp_path: Path, text: str | bytes) -> str:
    path = tmp_path / "servers.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigurationError) as info:
        load_servers(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    return message


@pytest.mark.parametrize(("text", "says"), [
    ('{"mcpServers": {"files": {"command": "a"}, "files": {"command": "b"}}}', '"files" twice'),
    ('{"mcpServers": {"files": {"command": "rm", "args": [], "command": "echo"}}}', '"command" twice'),
    ('{"mcpServers": {"files": {"command": "a"}}, "mcpServers": {}}', '"mcpServers" twice'),
])
def test_a_key_written_twice_is_refused_not_read_as_its_last_copy(tmp_path: Path, text: str, says: str) -> None:
    """A reviewer reads the first copy, json.loads keeps the last: which server runs must not depend on that."""
    message = _refused(tmp_path, text)
    assert f"{says} in one object" in message and "write each key once" in message


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400"])
@pytest.mark.parametrize("key", ["timeout", "call_timeout"])
def test_timeouts_are_finite_seconds(tmp_path: Path, key: str, value: str) -> None:
    """NaN passed `value <= 0` and made every call's limit NaN; Infinity unbounded the listing and crashed the
    start with an OverflowError."""
    message = _refused(tmp_path, f'{{"mcpServers": {{"s": {{"command": "x", "proctor": {{"{key}": {value}}}}}}}}}')
    assert f'"{key}" is positive seconds' in message or "not a number JSON allows" in message


def test_disabled_is_true_or_false(tmp_path: Path) -> None:
    """"disabled": "true" meant to turn the server off; it was started."""
    message = _refused(tmp_path, '{"mcpServers": {"s": {"command": "x", "disabled": "true"}}}')
    assert "server 's'" in message and '"disabled" is true or false' in message


def test_a_deeply_nested_file_is_refused_located(tmp_path: Path) -> None:
    message = _refused(tmp_path, '{"mcpServers": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert "nested deeper than" in message


def test_a_file_that_is_not_utf8_is_refused_located(tmp_path: Path) -> None:
    message = _refused(tmp_path, b'{"mcpServers": {"s": {"command": "\xff"}}}')
    assert "not UTF-8" in message


def _mcp_serve(tmp_path: Path, servers: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`proctor mcp serve` with `servers` as its servers.json and a deny-all policy, its stdin closed."""
    (tmp_path / "servers.json").write_text(servers)
    (tmp_path / "policy.yaml").write_text("version: 1\ndefault: deny\n")
    return subprocess.run([sys.executable, "-m", "proctor.cli", "mcp", "serve", "--servers",
                           str(tmp_path / "servers.json"), "--policy", str(tmp_path / "policy.yaml"),
                           "--audit", str(tmp_path / "audit.jsonl")], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_mcp_serve_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    done = _mcp_serve(tmp_path, '{"mcpServers": ' + "[" * 100_000 + "]" * 100_000 + "}", 60)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert "servers.json:1:" in done.stderr and "nested deeper than" in done.stderr


def test_a_good_file_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "servers.json"
    path.write_text('{"mcpServers": {"files": {"command": "npx", "args": ["-y", "x"], "env": {"A": "1"}, '
                    '"proctor": {"timeout": 5, "call_timeout": 2.5}}, "off": {"command": "y", "disabled": true}, '
                    '"web": {"url": "http://127.0.0.1:1/mcp", "headers": {"Authorization": "Bearer t"}}}}')
    files, web = load_servers(path)
    assert (files.name, files.command, files.args, files.timeout, files.call_timeout) == \
        ("files", "npx", ("-y", "x"), 5.0, 2.5)
    assert (web.name, web.url, dict(web.headers)) == ("web", "http://127.0.0.1:1/mcp", {"Authorization": "Bearer t"})


@pytest.mark.parametrize("entry", ["url", "command"])
def test_an_upstream_that_does_not_start_is_named_with_its_entry_and_the_fix(tmp_path: Path, entry: str) -> None:
    """`the MCP server t failed: ConnectError: All connection attempts failed` said neither where the server was
    configured nor what was reached: the one line names the file, the server, its URL or command, and the fix."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = ({"url": f"http://user:s3cret@127.0.0.1:{port}/mcp", "proctor": {"timeout": 5}} if entry == "url" else
            {"command": str(tmp_path / "no-such-server"), "args": ["--stdio"]})
    done = _mcp_serve(tmp_path, json.dumps({"mcpServers": {"tickets": spec}}), 120)
    assert done.returncode == 1, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr, done.stderr
    target = f"http://user:***@127.0.0.1:{port}/mcp" if entry == "url" else f"{tmp_path / 'no-such-server'} --stdio"
    assert f"{tmp_path / 'servers.json'}: server 'tickets' ({target}) did not start:" in done.stderr, done.stderr
    assert "s3cret" not in done.stderr
    assert 'fix its entry, or set "disabled": true to serve without it' in done.stderr, done.stderr
