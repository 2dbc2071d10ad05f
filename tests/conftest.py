"""Suite-wide test settings."""

from __future__ import annotations

import gc
import signal
from collections.abc import Iterator

import pytest

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
