"""Without an optional extra installed, what needs it fails closed with one line naming the extra."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

# Run in a fresh interpreter where importing the named top-level packages fails, as when the extra is absent.
_BLOCK = textwrap.dedent("""\
    import importlib.abc, sys
    class _Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
    sys.meta_path.insert(0, _Absent())
""")


def _python(blocked: set[str], body: str) -> subprocess.CompletedProcess[str]:
    code = _BLOCK.format(blocked=sorted(blocked)) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_redis_ledger_without_redis_installed_is_a_configuration_error_naming_the_extra() -> None:
    """Gate(ledger='redis://…') without redis-py is a ConfigurationError (no local ledger instead), password hidden."""
    proc = _python({"redis", "hiredis"}, """
        from proctor import Gate, Policy
        from proctor.errors import ConfigurationError
        try:
            Gate(Policy.from_string("version: 1\\ndefault: allow\\n"), ledger="redis://u:hunter2@127.0.0.1:1/0")
        except ConfigurationError as exc:
            print("refused:", exc)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "refused:" in proc.stdout and "pip install 'proctor[redis]'" in proc.stdout
    assert "hunter2" not in proc.stdout


@pytest.mark.parametrize("command", [["verify", "postgresql://u:hunter2@127.0.0.1:1/db"],
                                     ["export", "postgresql://u:hunter2@127.0.0.1:1/db", "/nonexistent/out.jsonl"]])
def test_audit_commands_on_postgresql_without_psycopg_say_what_to_install(command: list[str]) -> None:
    """`proctor audit verify|export postgresql://…` without psycopg: one line naming the extra, exit 2, no traceback."""
    proc = _python({"psycopg"}, f"""
        import sys
        from proctor.cli import main
        sys.exit(main(["audit", *{command!r}]))
    """)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'proctor[postgres]'" in proc.stderr
    assert "Traceback" not in proc.stderr and "hunter2" not in proc.stderr
