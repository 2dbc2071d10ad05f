"""`make test` on a fresh machine (issue 34.1): scripts/system-deps installs what the tests need, or stops at
once with the one command to run; scripts/fresh-clone-check runs the README's commands in a fresh clone.

The machine's tools are shadowed on PATH (a directory of links to every command except the hidden
ones), apt-get and sudo are replaced by stand-ins that record being called, and "a user who cannot
install" is a real one: `nobody`, when the tests run as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Every test here starts a process (see tests/conftest.py): `make test` runs them, `make check` does not.
pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "system-deps"
HIDDEN = {"bwrap", "tmux", "redis-server", "chromium", "chromedriver", "apt-get", "apt", "sudo"}
WANTED = "bubblewrap tmux redis-server chromium chromium-driver"


def _shadowed_path(bin_dir: Path) -> str:
    """A PATH with every command of this one, except HIDDEN (and a user's own tools under /root)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for entry in os.environ["PATH"].split(os.pathsep):
        if not entry or entry.startswith("/root") or not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            exe = os.path.join(entry, name)
            if name in HIDDEN or (bin_dir / name).exists() or not os.access(exe, os.X_OK) or os.path.isdir(exe):
                continue
            (bin_dir / name).symlink_to(exe)
    return str(bin_dir)


def _stand_in(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def _as_nobody() -> list[str]:
    return ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] if os.geteuid() == 0 else []


@pytest.fixture
def newcomer() -> Iterator[Path]:
    """A directory `nobody` can reach (pytest's tmp_path is under root's private one), with a shadowed PATH
    in bin/ and stand-ins that cannot install."""
    with tempfile.TemporaryDirectory(prefix="proctor-newcomer-") as root:
        yield _newcomer(Path(root))


def _newcomer(tmp_path: Path) -> Path:
    tmp_path.chmod(0o755)
    bin_dir = tmp_path / "bin"
    _shadowed_path(bin_dir)
    calls = tmp_path / "calls"
    _stand_in(bin_dir / "apt-get", f'echo "apt-get $*" >> {calls}\necho "E: Permission denied" >&2\nexit 100\n')
    _stand_in(bin_dir / "sudo", f'echo "sudo $*" >> {calls}\necho "sudo: a password is required" >&2\nexit 1\n')
    if os.geteuid() == 0:
        shutil.chown(tmp_path, "nobody", "nogroup")
    return tmp_path


def test_a_user_who_cannot_install_is_stopped_with_the_one_command(newcomer: Path) -> None:
    """Not root, no passwordless sudo, tools missing: exit 1, the missing packages, and one line to run; apt-get
    is never called (sudo only as `sudo -n true`, to learn it asks for a password)."""
    done = subprocess.run([*_as_nobody(), str(SCRIPT)], env={"PATH": str(newcomer / "bin"), "HOME": str(newcomer)},
                          capture_output=True, text=True, timeout=60, cwd=newcomer)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert f"missing here: {WANTED}" in lines[0]
    assert lines[-1] == f"sudo apt-get update && sudo apt-get install -y {WANTED}"
    calls = (newcomer / "calls").read_text().splitlines() if (newcomer / "calls").exists() else []
    assert calls == ["sudo -n true"]


def test_root_installs_what_is_missing_with_apt_get_and_checks_it_arrived(newcomer: Path) -> None:
    """As root, apt-get update then one apt-get install of exactly the missing packages; what it installs
    (here: the stand-in links the real commands back) is checked before exit 0."""
    if os.geteuid() != 0:
        pytest.skip("installing needs root (this suite runs as root in CI)")
    bin_dir, calls = newcomer / "bin", newcomer / "calls"
    links = "".join(f"ln -sf {shutil.which(exe)} {bin_dir}/{exe}\n" for exe in
                    ("bwrap", "tmux", "redis-server", "chromium", "chromedriver"))
    _stand_in(bin_dir / "apt-get", f'echo "apt-get $*" >> {calls}\ncase "$1" in install) {links};; esac\nexit 0\n')
    done = subprocess.run([str(SCRIPT)], env={"PATH": str(bin_dir), "HOME": str(newcomer)}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == ["apt-get update -qq", f"apt-get install -y -qq {WANTED}"]


def test_an_install_that_brings_nothing_is_not_believed(newcomer: Path) -> None:
    """apt-get says it succeeded but the commands are still missing: exit 1 naming them."""
    if os.geteuid() != 0:
        pytest.skip("installing needs root")
    _stand_in(newcomer / "bin" / "apt-get", "exit 0\n")
    done = subprocess.run([str(SCRIPT)], env={"PATH": str(newcomer / "bin"), "HOME": str(newcomer)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"still missing after apt-get install: {WANTED}" in done.stderr


def test_everything_present_installs_nothing() -> None:
    """On this machine (CI installed the packages) the script exits 0 at once without calling apt-get."""
    if any(shutil.which(exe) is None for exe in ("bwrap", "tmux", "redis-server", "chromium", "chromedriver")):
        pytest.skip("this machine lacks some of the packages: the other tests cover that")
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == ""


def test_make_test_on_a_fresh_clone_stops_before_building_anything() -> None:
    """scripts/fresh-clone-check --stop: a fresh clone, shadowed tools, a user who cannot install: `make test`
    exits non-zero printing the one command, and no .venv was built (the script checks each)."""
    if shutil.which("git") is None or shutil.which("make") is None:
        pytest.skip("needs git and make")
    done = subprocess.run([str(ROOT / "scripts" / "fresh-clone-check"), "--stop"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"sudo apt-get update && sudo apt-get install -y {WANTED}" in done.stdout
