"""PolicySource: a policy file reloaded on change and on SIGHUP, refused when bad, pinned per run on request."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from policy_files import replace_file

from proctor.policy import Policy
from proctor.policy.reload import PolicyChange, PolicyRefused, PolicySource


def _policy(version: int, extra: str = "") -> str:
    # Every part a decision reads differs by version: the rule's name, its reason and the default.
    return (f"version: 1\ndefault: {'allow' if version % 2 else 'deny'}\n{extra}rules:\n"
            f"  - name: r{version}\n    match: {{tool: probe}}\n    when: \"args.n >= 0\"\n"
            f"    decision: {'deny' if version % 2 else 'allow'}\n    reason: v{version}\n")


def test_change_refusal_and_pins(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(_policy(0, "reload: new_runs\n"))
    changes: list[PolicyChange] = []
    refusals: list[PolicyRefused] = []
    source = PolicySource(path, check_every_ms=0, on_change=changes.append, on_refused=refusals.append)
    first = source.current()
    assert source.for_run("run_a") is first
    replace_file(path, _policy(1, "reload: new_runs\n"))
    second = source.current()
    assert second is not first and [(c.old_sha256, c.new_sha256) for c in changes] == [(first.sha256, second.sha256)]
    assert source.for_run("run_a") is first  # pinned: the policy it started with
    assert source.for_run("run_b") is second
    source.end_run("run_a")
    assert source.for_run("run_a") is second
    # A bad file: refused with its located error, reported once, the old policy keeps deciding.
    replace_file(path, _policy(2).replace("decision: allow", "decision: alow"))
    assert source.current() is second and source.current() is second
    assert len(refusals) == 1 and refusals[0].kept_sha256 == second.sha256
    assert refusals[0].message.startswith(f"{path}:") and "alow" in refusals[0].message
    # The same meaning written again (comments, key order) changes nothing.
    replace_file(path, "# reformatted\n" + _policy(1, "reload: new_runs\n"))
    assert source.current() is second and len(changes) == 1
    # each_call (the default) in the new policy: runs in flight switch at their next call.
    replace_file(path, _policy(3))
    third = source.current()
    assert source.for_run("run_b") is third and source.for_run("run_c") is third
    # new_runs again: run_b and run_c keep what they started with, a new run gets the new policy.
    replace_file(path, _policy(4, "reload: new_runs\n"))
    fourth = source.current()
    assert source.for_run("run_b") is second and source.for_run("run_c") is third
    assert source.for_run("run_d") is fourth


def test_checks_at_most_every_interval_and_on_sighup(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(_policy(0))
    source = PolicySource(path, check_every_ms=3_600_000)
    first = source.current()
    replace_file(path, _policy(1))
    assert source.current() is first  # not due: the file is not even stat'ed
    uninstall = source.install_sighup()
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 5
        while source.current() is first:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert source.current().sha256 == Policy.from_string(_policy(1)).sha256
    finally:
        uninstall()
    assert source.reload() is False  # nothing new


def test_sighup_reaches_every_source_that_installed_it(tmp_path: Path) -> None:
    """Two gates of one process on two policy files: SIGHUP checks both. A second `install_sighup` must not take
    the signal from the first, and uninstalling in reverse order leaves the process's handler as it was."""
    paths = [tmp_path / "a.yaml", tmp_path / "b.yaml"]
    for path in paths:
        path.write_text(_policy(0))
    sources = [PolicySource(path, check_every_ms=3_600_000) for path in paths]
    firsts = [source.current() for source in sources]
    for path in paths:
        replace_file(path, _policy(1))
    before = signal.getsignal(signal.SIGHUP)
    uninstalls = [source.install_sighup() for source in sources]
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        deadline = time.monotonic() + 5
        while any(source.current() is first for source, first in zip(sources, firsts, strict=True)):
            assert time.monotonic() < deadline, "a source that installed SIGHUP was not told"
            time.sleep(0.01)
    finally:
        for uninstall in reversed(uninstalls):
            uninstall()
    assert signal.getsignal(signal.SIGHUP) == before


WORKER = r"""
import json, sys, time
from proctor.calls import RunInfo
from proctor.policy.admission import admit
from proctor.policy.reload import PolicySource
from proctor.policy.simulate import RecordedRun

path, out, stop = sys.argv[1], sys.argv[2], sys.argv[3]
changes = []
source = PolicySource(path, check_every_ms=1, on_change=lambda c: changes.append([c.old_sha256, c.new_sha256]))
run = RecordedRun(RunInfo(id="run_1"), (), (), {})
seen = {}
import os
n = 0
while not os.path.exists(stop) or n < 50:
    policy = source.current()  # once per call: the call is decided by this object only
    adm = admit(policy, "probe", {"n": n}, tools=None, run=run, declared_side_effect="read")
    d = adm.decision
    key = (policy.sha256, d.policy_sha256, d.outcome, ",".join(d.rules), d.reason)
    seen[key] = seen.get(key, 0) + 1
    n += 1
    if n == 1:
        open(out + ".ready", "w").close()
with open(out, "w") as f:
    json.dump({"decisions": [[*k, v] for k, v in seen.items()], "changes": changes, "calls": n}, f)
"""


def test_eight_processes_decide_by_one_policy_each_while_the_file_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(_policy(0))
    versions = {Policy.from_string(_policy(v)).sha256: v for v in range(101)}
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    stop = tmp_path / "stop"
    outs = [tmp_path / f"out{i}.json" for i in range(8)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    procs = [subprocess.Popen([sys.executable, str(script), str(path), str(out), str(stop)], env=env)
             for out in outs]
    try:
        deadline = time.monotonic() + 120
        while not all(Path(f"{out}.ready").exists() for out in outs):  # every process is deciding
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        for v in range(1, 101):
            if v % 10 == 5:  # a half-written file now and then: refused, never decides
                path.write_text(_policy(v)[:40])
                time.sleep(0.005)
            replace_file(path, _policy(v))
            time.sleep(0.03)
        time.sleep(0.3)
        stop.write_text("")
        for p in procs:
            assert p.wait(timeout=120) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    final = Policy.from_string(_policy(100)).sha256
    for out in outs:
        data = json.loads(out.read_text())
        for held, decided, outcome, rules, reason, _count in data["decisions"]:
            v = versions[held]  # only whole, valid versions ever decided
            assert decided == held  # the decision names the policy that made it
            assert (outcome, rules, reason) == (("deny" if v % 2 else "allow"), f"r{v}", f"v{v}")
        # The changes each process reports chain old -> new, in order, ending at the last version.
        assert len({d[0] for d in data["decisions"]}) >= 10  # it decided under many versions, not one
        chain = data["changes"]
        assert chain and chain[-1][1] == final
        assert all(a[1] == b[0] for a, b in itertools.pairwise(chain))
        assert [versions[c[1]] for c in chain] == sorted(versions[c[1]] for c in chain)


def test_a_bad_file_at_start_is_an_error(tmp_path: Path) -> None:
    from proctor.errors import PolicyError

    path = tmp_path / "policy.yaml"
    path.write_text("version: 1\nrules: 7\n")
    with pytest.raises(PolicyError):
        PolicySource(path)


@pytest.mark.parametrize("at_start", [False, True])
def test_a_policy_path_that_is_no_regular_file_is_refused_without_blocking(tmp_path: Path, at_start: bool) -> None:
    """A FIFO (or a device) put where the policy was — a symlink to one, say — is refused with its located error;
    before, the read blocked every call of the gate for as long as no process wrote to the FIFO."""
    from proctor.errors import PolicyError

    path, fifo = tmp_path / "policy.yaml", tmp_path / "policy.fifo"
    os.mkfifo(fifo)
    started = time.monotonic()
    if at_start:
        path.symlink_to(fifo)
        with pytest.raises(PolicyError, match=r"policy\.yaml:1:1: cannot read policy: a FIFO, not a regular file"):
            PolicySource(path)
    else:
        path.write_text(_policy(0))
        refusals: list[PolicyRefused] = []
        source = PolicySource(path, check_every_ms=0, on_refused=refusals.append)
        first = source.current()
        path.unlink()
        path.symlink_to(fifo)
        assert source.current() is first  # the old policy keeps deciding
        assert len(refusals) == 1 and "cannot read policy: a FIFO, not a regular file" in refusals[0].message
    assert time.monotonic() - started < 5


def test_a_policy_path_that_becomes_a_directory_is_refused_and_leaves_no_file_open(tmp_path: Path) -> None:
    """A directory at the policy path is refused as one (not a regular file), on every reload, each closing what it
    opened: the check had opened it and left the descriptor open when reading it failed (one for each reload)."""
    path = tmp_path / "policy.yaml"
    path.write_text(_policy(0))
    refusals: list[PolicyRefused] = []
    source = PolicySource(path, check_every_ms=0, on_refused=refusals.append)
    first = source.current()
    path.unlink()
    path.mkdir()
    open_before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        assert source.reload() is False
    assert len(os.listdir("/proc/self/fd")) == open_before
    assert source.current() is first
    assert refusals and all("cannot read policy: a directory, not a regular file" in r.message for r in refusals)
