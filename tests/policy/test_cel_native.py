"""proctor imports CEL's native module on its own: nothing replaced, the application's `import cel` unchanged."""

from __future__ import annotations

import subprocess
import sys

import pytest

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process


def test_proctor_leaves_the_cel_package_to_the_application() -> None:
    """After proctor compiled a condition, `import cel` runs the real package, with the very classes proctor uses."""
    code = (
        "import sys\n"
        "from proctor.policy.conditions import compile_expression\n"
        "from proctor.policy._cel import cel as native\n"
        "compile_expression('args.to.endsWith(\"@x.com\")')\n"
        "assert 'cel' not in sys.modules and 'cel.cli' not in sys.modules\n"
        "import cel\n"
        "assert cel.__file__.endswith('__init__.py') and 'cel.cli' in sys.modules\n"
        "assert cel.Context is native.Context and cel.compile is native.compile\n"
        "assert cel.evaluate('1 + 2') == 3\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
