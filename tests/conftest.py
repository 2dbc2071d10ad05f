"""Suite-wide test settings, and the test tiers.

Tiers: `make check` runs the tests that start no server, browser, sandbox or other process
(``-m "not server and not browser and not sandbox and not process"``, hypothesis with the "check"
profile: a tenth of each test's examples, see tests/tiers.py); `make test` runs them all, with every
example. The markers are given here, at collection, so a new test gets them without writing them:

- by where it lives: tests/fleet (real Redis and PostgreSQL) are ``server``, tests/interpreter ``sandbox``;
- by the fixtures it uses (`FIXTURE_MARKS`);
- by what its module holds (`STARTS`): a module that imports `Interpreter`, `CodeAgent`, `run_demo`,
  `MCPToolset`, the browser helpers… gets the marker of what those start.

A test that starts any other process — a `proctor` command or a script as a subprocess, a forked
child, a multiprocessing worker, a pty — is marked ``process`` where it is written (`@pytest.mark.process`,
or `pytestmark` for a module whose tests all do).

What that misses is caught when it happens: a test without the marker that starts a sandboxed worker
in this process, a subprocess that is a server, a browser or an agent run, or any other process while it
has no tier marker at all, fails at teardown naming the marker to add (`_tier_guard`). So `make check`
never starts one silently, and stays fast.
"""

from __future__ import annotations

import gc
import multiprocessing.process
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
from fleet_engines import PostgresServer, RedisServer
from hypothesis import settings
from tiers import CHECK_PROFILE, TIERS

# `make check` loads this profile (--hypothesis-profile=check); `make test` keeps hypothesis' default.
settings.register_profile("check", CHECK_PROFILE)
#: Fixtures that start something: the fleet's real servers; the inbox's agent runs (tests/serve/conftest.py).
FIXTURE_MARKS = {"redis_server": "server", "postgres_server": "server", "inbox": "sandbox"}
#: Objects whose presence in a test module means its tests start something: "module.qualname" -> marker.
STARTS = {
    "proctor.interpreter.interpreter.Interpreter": "sandbox",
    "proctor.agent.code_agent.CodeAgent": "sandbox",
    "proctor.integrations.smolagents.GovernedExecutor": "sandbox",
    "proctor.integrations.smolagents.govern": "sandbox",
    "smolagents.mcp_client.MCPClient": "server",
    "proctor.agent.demo.app.run_demo": "sandbox",
    "proctor.integrations.mcp.MCPToolset": "server",
    "fleet_engines.RedisServer": "server",
    "fleet_engines.PostgresServer": "server",
    "serve.browser.serving": "server",
    "serve.browser.chromium": "browser",
    # A local OpenAI-compatible server (a thread on localhost) that LiteLLMModel talks to.
    "openai_server.serve": "server",
    # OTLP receivers on localhost; their exporters' retry threads outlive the test that made them.
    "otlp_receivers.HttpReceiver": "server",
    "otlp_receivers.GrpcReceiver": "server",
    "otlp_receivers.BlackHole": "server",
    # An HTTP server on localhost standing for an internal host (a schema's `$ref` must not reach it).
    "internal_host.internal_host": "server",
}
BY_DIRECTORY = {"fleet": "server", "interpreter": "sandbox", "codemode": "server", "ops": "server"}
#: `proctor` subcommands that start an agent's sandboxed worker or a server, when a test runs them as a process.
CLI_STARTS = {"demo": "sandbox", "run": "sandbox", "runs": "sandbox", "serve": "server", "mcp": "server"}
TESTS = Path(__file__).resolve().parent


def _marks_of(item: pytest.Item) -> set[str]:
    found: set[str] = set()
    parts = Path(str(item.path)).resolve().relative_to(TESTS).parts
    if len(parts) > 1 and parts[0] in BY_DIRECTORY:
        found.add(BY_DIRECTORY[parts[0]])
    found |= {FIXTURE_MARKS[name] for name in getattr(item, "fixturenames", ()) if name in FIXTURE_MARKS}
    module = getattr(item, "module", None)
    if module is not None:
        found |= _module_marks(module)
    return found


_by_module: dict[str, frozenset[str]] = {}


def _module_marks(module: Any) -> frozenset[str]:
    """The markers of what `module`'s globals start (test helpers are named as imported: `serve.browser`)."""
    cached = _by_module.get(module.__name__)
    if cached is None:
        found = set()
        for value in vars(module).values():
            name = f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', '')}"
            found |= {marker for key, marker in STARTS.items() if name == key or name.endswith("." + key)}
        cached = _by_module[module.__name__] = frozenset(found)
    return cached


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for marker in _marks_of(item) - {m.name for m in item.iter_markers()}:
            item.add_marker(marker)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move everything collection built (every test module, what they import) out of the collector's sight.

    `_collect_garbage_per_module` then scans only what tests made since, instead of some 340,000
    objects after each module (a third of a second each); garbage a test leaves is collected as before.
    """
    gc.collect()
    gc.freeze()


def _noting(original: Any, started: list[str], what: str) -> Any:
    def noted(*args: Any, **kwargs: Any) -> Any:
        started.append(what)
        return original(*args, **kwargs)

    return noted


def _started_by(argv: Sequence[str]) -> str | None:
    """The tier marker a subprocess with this argv needs (None: it starts nothing of the kind)."""
    if not argv:
        return None
    exe = os.path.basename(str(argv[0]))
    if exe in ("redis-server", "initdb", "pg_ctl", "postgres") or "/postgresql/" in str(argv[0]):
        return "server"
    if exe in ("chromium", "chromedriver", "chrome"):
        return "browser"
    if exe == "bwrap":
        return "sandbox"
    words = [str(a) for a in argv]
    if exe == "proctor":
        command = words[1:2]
    elif "proctor.cli" in words:
        command = words[words.index("proctor.cli") + 1:][:1]
    else:
        return None
    return CLI_STARTS.get(command[0]) if command else None


@pytest.fixture(autouse=True)
def _tier_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fail a test that starts a server, browser, sandbox or process without its marker (see the module docstring)."""
    marked = {m.name for m in request.node.iter_markers() if m.name in TIERS}
    if marked == set(TIERS):
        yield
        return
    started: list[str] = []
    popen_init = subprocess.Popen.__init__

    def watched_init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        needed = _started_by([os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv])
        if needed and needed not in marked:
            started.append(f"{needed}: {' '.join(map(str, argv[:4]))}")
        elif needed is None and not marked:  # any other process: out of `make check` too
            started.append(f"process: {' '.join(map(str, argv[:4]))}")
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", watched_init)
    if not marked:  # a process started without subprocess: fork, a pty, os.system, multiprocessing
        for module, name, what in ((os, "fork", "os.fork()"), (os, "forkpty", "a pty (os.forkpty)"),
                                   (os, "posix_spawn", "os.posix_spawn()"), (os, "posix_spawnp", "os.posix_spawnp()"),
                                   (os, "system", "os.system()"),
                                   (multiprocessing.process.BaseProcess, "start", "a multiprocessing worker")):
            monkeypatch.setattr(module, name, _noting(getattr(module, name), started, f"process: {what}"))
    if "sandbox" not in marked:
        from proctor.interpreter import host

        spawn = host.spawn

        def watched_spawn(*args: Any, **kwargs: Any) -> Any:
            started.append("sandbox: a sandboxed worker (Interpreter)")
            return spawn(*args, **kwargs)

        monkeypatch.setattr(host, "spawn", watched_spawn)
    yield
    if started:
        needed = sorted({s.split(":", 1)[0] for s in started})
        pytest.fail(f"this test starts {'; '.join(dict.fromkeys(started))}, but is not marked "
                    f"{' and '.join(needed)}: add `pytestmark = [{', '.join(f'pytest.mark.{n}' for n in needed)}]` "
                    "to its module (or an entry to STARTS in tests/conftest.py), so `make check` leaves it out",
                    pytrace=False)

# A suite started in the background by a non-interactive shell (`make test &`, nohup, some CI
# runners) inherits SIGINT ignored, and every child it starts inherits that too: the tests that
# press Ctrl-C on a `proctor run`, a `tail -f` or an agent program would then wait for ever.
# Python's own handler here makes children start with the default disposition again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True, scope="module")
def _collect_garbage_per_module() -> Iterator[None]:
    """Collect garbage after each module, so a leaked socket or event loop fails the module that leaked it.

    Without this, `filterwarnings = error` turns a ResourceWarning into a failure of
    whichever unrelated test happens to be running when the collector runs.
    """
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _private_state_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`proctor run` without --audit writes to $XDG_STATE_HOME/proctor: a test's own directory, not the home's."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state")))
    monkeypatch.delenv("PROCTOR_AUDIT", raising=False)
    monkeypatch.delenv("PROCTOR_AUDIT_KEY", raising=False)


@pytest.fixture(params=["native", "python"])
def tokeniser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run a provenance test with the C tokeniser (proctor._provtok, which must have built) and with the Python one."""
    from proctor import provenance

    if request.param == "native":
        assert provenance._native is not None, (
            "proctor._provtok did not build: install a C compiler and the Python headers (python3-dev), "
            "then `pip install -e '.[dev]'`")
    else:
        monkeypatch.setattr(provenance, "_native", None)
    provenance._analyze_short.cache_clear()
    return str(request.param)


@pytest.fixture(autouse=True)
def _logging_as_a_process_starts() -> Iterator[None]:
    """structlog unconfigured before and after every test, its events going to the logging module
    (`proctor.telemetry.logging`): a test that configured it (the CLI's `main` does) would otherwise leave it so
    for the next tests of its worker, whose `caplog` then sees nothing of what proctor logs."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture(autouse=True)
def _stable_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rendered tables take their width from $COLUMNS off a terminal: every test starts at 120 (a test of
    another width sets its own), so output does not depend on the worker or shell the suite runs in."""
    monkeypatch.setenv("COLUMNS", "120")


# -- the real servers (tests/fleet_engines.py): the one place the suite starts Redis and PostgreSQL ------------


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A fresh redis-server on a Unix socket, stopped after the test."""
    with tempfile.TemporaryDirectory(prefix="proctor-redis-") as root:
        server = RedisServer(Path(root))
        server.start()
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL cluster (run as nobody when the suite runs as root: PostgreSQL refuses root) for every test
    of the session: tests name their own audit logs and schemas, and lift the halts they set."""
    server = PostgresServer()
    try:
        server.start()
        yield server
    finally:
        server.cleanup()
