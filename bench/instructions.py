"""Instructions per governed call, before and after, counted by callgrind (deterministic on a loaded machine).

    .venv/bin/python bench/instructions.py --compare REF [--calls 2000] [--mode full|gate|channel]
    .venv/bin/python bench/instructions.py --against DIR ...   (another checkout, its C extensions built)

Runs one process per side (revision REF's `proctor` package exported to a temporary directory,
and this checkout's) under ``valgrind --tool=callgrind``: an Interpreter (process sandbox)
makes 300 warm-up calls, the cyclic GC is frozen (the p50 call sees no full collection), then
callgrind counts the host's instructions over `--calls` more — only those (the instrumentation
is switched on and off around them by a tiny C helper compiled here, as valgrind's client
requests have no Python binding). Neither end spins (spinning is waiting, not work).

Modes: ``full`` the host side of the governed round trip (channel, interpreter, gate);
``gate`` `gate.submit` alone in process; ``channel`` the round trip with the gate's work
replaced by a canned outcome. The worker's side is counted with ``--worker`` (whole worker
process, two runs of N and 2N calls, the difference; both workers with their spin budget set
to 0, so each polls once before it blocks, as a worker that may spin does).

Needs valgrind, its headers (valgrind/callgrind.h) and a C compiler.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HELPER = r"""
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_START_INSTRUMENTATION; CALLGRIND_ZERO_STATS; }
void cg_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""

PROGRAM = r'''
import ctypes, gc, logging, os, socket, sys
import structlog
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
from proctor.gate import Gate
from proctor.interpreter import Interpreter
from proctor.policy import Policy
from proctor.tools import tool
CG = ctypes.CDLL(os.environ["CG_HELPER"]) if os.environ.get("CG_HELPER") else None
try:
    from proctor.interpreter import spinning
    if os.environ.get("SPIN_ZERO"):  # counting the worker: it polls once before it blocks, as when it spins
        spinning.SPIN_NS = 0
    else:
        spinning.DISABLED = True
except ImportError:  # before adaptive spinning: no host spin
    import proctor.interpreter.host as host
    host.SPIN_NS = 0

@tool(side_effect="read")
def lookup(order: str) -> str:
    """Look an order up.

    Args:
        order: Order id.
    """
    return order

n, mode = int(sys.argv[1]), sys.argv[2]
policy = Policy.from_dict({"version": 1, "default": "deny", "rules": [
    {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"}]})
gate = Gate(policy, tools=[lookup])
if mode == "gate":
    ctx = gate.start_run()
    answer = lambda value, error: None
    for i in range(300):
        gate.submit("lookup", {"order": "a"}, context=ctx, call_id=f"call_{i}", on_result=answer)
    gc.collect(); gc.freeze()
    CG and CG.cg_start()
    for i in range(n):
        gate.submit("lookup", {"order": "a"}, context=ctx, call_id=f"call_{i}", on_result=answer)
    CG and CG.cg_stop()
    sys.exit(0)
with Interpreter([lookup], gate, sandbox="process", timeout=3600) as py:
    if mode == "channel":
        canned = gate.submit("lookup", {"order": "a"})
        gate.submit = lambda *a, **k: canned
    assert py.run("for i in range(300):\n    lookup('a')").error is None
    gc.collect(); gc.freeze()
    CG and CG.cg_start()
    r = py.run(f"for i in range({n}):\n    lookup('a')")
    CG and CG.cg_stop()
    assert r.error is None, r.error
    w = py._worker  # let the worker exit by itself, so callgrind writes its profile
    if hasattr(w, "thaw"):
        w.thaw()
    if hasattr(w, "sock"):  # the channel was a socketpair before 23b5d68
        w.sock.shutdown(socket.SHUT_RDWR)
    else:  # two pipes: the worker reads the end of its input and exits
        w._out.close()
    w.proc.wait(600)
'''


def _count(pythonpath: str, n: int, mode: str, helper: str, tmp: str, worker: bool) -> int:
    out = os.path.join(tmp, f"cg-{os.path.basename(pythonpath)}-{n}-{mode}-{worker}")
    env = {**os.environ, "PYTHONPATH": pythonpath, "PYTHONHASHSEED": "0"}
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p"]
    if worker:
        cmd += ["--trace-children=yes"]
        env["SPIN_ZERO"] = "1"
    else:
        env["CG_HELPER"] = helper
        cmd += ["--instr-atstart=no"]
    # cwd: `-c` puts the working directory first on sys.path, ahead of PYTHONPATH's tree.
    subprocess.run([*cmd, sys.executable, "-c", PROGRAM, str(n), mode], env=env, check=True, cwd=tmp,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=3600)
    totals = {}
    for name in os.listdir(tmp):
        if not name.startswith(os.path.basename(out) + "."):
            continue
        if not worker and not name.endswith(".1"):  # the host: only the part between cg_start and cg_stop
            continue
        with open(os.path.join(tmp, name)) as fh:
            text = fh.read()
        cmdline = re.search(r"^cmd: (.*)$", text, re.M)
        summary = re.search(r"^summary: (\d+)$", text, re.M)
        if summary:
            totals[(cmdline.group(1) if cmdline else "") + name] = int(summary.group(1))
    if worker:  # the worker is the process started with the bootstrap on stdin
        return sum(v for k, v in totals.items() if " -S -B " in k)
    return sum(totals.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--compare", metavar="REF", help="revision REF's proctor/ (git archive: no C extensions)")
    which.add_argument("--against", metavar="DIR", help="the checkout DIR's proctor/, with its built C extensions")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--mode", choices=("full", "gate", "channel"), default="full")
    parser.add_argument("--worker", action="store_true", help="count the worker's side instead (mode full)")
    opts = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("cc") is None:
        print("needs valgrind and a C compiler", file=sys.stderr)
        return 2
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="proctor-instructions-") as tmp:
        helper = os.path.join(tmp, "cgctl.so")
        source = os.path.join(tmp, "cgctl.c")
        with open(source, "w") as fh:
            fh.write(HELPER)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", helper, source], check=True)
        before = os.path.join(tmp, "before")
        os.mkdir(before)
        if opts.against:
            shutil.copytree(os.path.join(os.path.abspath(opts.against), "proctor"), os.path.join(before, "proctor"))
        else:
            archive = subprocess.run(["git", "-C", repo, "archive", opts.compare, "proctor"], capture_output=True,
                                     check=True)
            subprocess.run(["tar", "-x", "-C", before], input=archive.stdout, check=True)
        after = repo
        if opts.worker:  # both workers poll once and do not spin (their channel's SPIN_NS is 0)
            after = os.path.join(tmp, "after")
            shutil.copytree(os.path.join(repo, "proctor"), os.path.join(after, "proctor"))
            for tree in (before, after):
                channel = os.path.join(tree, "proctor", "interpreter", "channel.py")
                with open(channel) as fh:
                    text = fh.read()
                with open(channel, "w") as fh:
                    fh.write(re.sub(r"^SPIN_NS = .*$", "SPIN_NS = 0", text, flags=re.M))
        rows = []
        for label, path in (("before", before), ("after", after)):
            if opts.worker:
                one = _count(path, opts.calls, "full", helper, tmp, True)
                two = _count(path, 2 * opts.calls, "full", helper, tmp, True)
                rows.append((label, (two - one) / opts.calls))
            else:
                rows.append((label, _count(path, opts.calls, opts.mode, helper, tmp, False) / opts.calls))
        side = "worker" if opts.worker else f"host ({opts.mode})"
        (_, b), (_, a) = rows
        print(f"{side} instructions per governed call: before ({opts.compare or opts.against}) {b / 1000:.1f}k, "
              f"after {a / 1000:.1f}k, after/before {a / b:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
