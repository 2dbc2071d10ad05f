"""Audit trail throughput: records/s written (fsync, flush) and verified.

Run by hand: ``.venv/bin/python bench/audit.py [--records 200000] [--fsync-records 2000] [--dir DIR]
[--workers N] [--runs 5]``, or ``--compare REV [--records N] [--runs 7]``: verify speed of the proctor
package at git revision REV (before) and of this checkout (after) on one generated log, each run a
fresh process, before and after alternating, at 1 and 2 workers; prints after/before of the medians
and of each adjacent pair (the machine's speed drifts, adjacent runs see the same machine).
Verify is measured in one process and with ``workers="auto"``, what ``proctor audit verify``
does by default (one process per usable CPU).
DIR should be on the filesystem the real log will live on (fsync cost is the disk's). Verify
prints the best and the median of `--runs` runs: on a machine shared with other jobs the
best is the closest to what the code costs, the median to what one run may see.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal

from proctor.audit import AuditLog, generate_keypair, verify
from proctor.audit.verify import auto_workers


def _intent(i: int) -> dict[str, object]:
    return {
        "call_id": f"call_{i:032x}",
        "run_id": "run_5f0c6a1e2b3d4c5e6f708192a3b4c5d6",
        "tool": "send_email",
        "side_effect": "external",
        "args": {"to": "ops@example.com", "subject": f"report {i}", "body": {"$redacted": "hmac-sha256:" + "ab" * 32}},
        "args_digest": "hmac-sha256:" + "cd" * 32,
        "decision": "allow",
        "rules": ["internal-mail"],
        "policy_sha256": "ef" * 32,
        "approval": None,
        "trace_id": "0af7651916cd43dd8448eb211c80319c",
        "span_id": "b7ad6b7169203331",
    }


def _outcome(i: int) -> dict[str, object]:
    return {"call_id": f"call_{i:032x}", "run_id": "run_5f0c6a1e2b3d4c5e6f708192a3b4c5d6", "tool": "send_email",
            "status": "ok", "duration_ns": 1_234_567, "trace_id": "0af7651916cd43dd8448eb211c80319c",
            "span_id": "b7ad6b7169203331"}


def write(path: Path, n: int, durability: str, key: Path) -> float:
    """Records/s appending n records (intent/outcome pairs) with the given durability."""
    with AuditLog(path, signing_key=key, durability=durability) as log:
        start = time.perf_counter()
        for i in range(n // 2):
            assert log.append("call_intent", _intent(i)).ok
            assert log.append("call_outcome", _outcome(i)).ok
        elapsed = time.perf_counter() - start
    return (n // 2 * 2) / elapsed


def verify_once(log: str, pub: str, workers: int) -> float:
    """Records/s of one `verify` of `log` in this process (for --compare's subprocesses)."""
    start = time.perf_counter()
    report = verify(log, pubkey=pub, workers=workers)
    elapsed = time.perf_counter() - start
    assert report.ok, report.failure
    return report.records / elapsed


def compare(ref: str, records: int, runs: int, directory: str | None) -> None:
    """Verify before (revision `ref`) and after (this checkout), alternating fresh processes, on one log."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        d = Path(tmp)
        base = d / "before"
        base.mkdir()
        archive = subprocess.run(["git", "-C", repo, "archive", ref, "proctor"], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True)
        key, pub, _ = generate_keypair(d / "key")
        log = d / "flush.jsonl"
        me = os.path.abspath(__file__)
        # Written by the older code, which both verifiers read: a log written now ends with a checkpoint
        # marked closed, whose signed statement verifiers older than that mark do not know (CKPT_SIG).
        # Intent/outcome pairs and the writer's checkpoints: the kinds with bookkeeping and the reference path.
        subprocess.run([sys.executable, me, "--write-once", str(log), str(records), str(key)],
                       env={**os.environ, "PYTHONPATH": str(base)}, cwd=str(d), check=True)
        for workers in (1, 2):
            rates: dict[str, list[float]] = {"before": [], "after": []}
            for i in range(runs):
                order = [("before", str(base)), ("after", repo)]
                if i % 2:
                    order.reverse()
                for label, path in order:
                    env = {**os.environ, "PYTHONPATH": path}
                    done = subprocess.run([sys.executable, me, "--verify-once", str(log), str(pub), str(workers)],
                                          env=env, capture_output=True, text=True, cwd=str(d), check=False)
                    if done.returncode != 0:
                        raise SystemExit(done.stderr[-2000:])
                    rates[label].append(float(done.stdout.split()[-1]))
            b, a = rates["before"], rates["after"]
            pairs = [x / y for x, y in zip(a, b, strict=True)]
            print(f"workers={workers}: before median {statistics.median(b):,.0f} rec/s (best {max(b):,.0f}), "
                  f"after median {statistics.median(a):,.0f} (best {max(a):,.0f}); after/before: medians "
                  f"{statistics.median(a) / statistics.median(b):.3f}, best {max(a) / max(b):.3f}, "
                  f"median of pairs {statistics.median(pairs):.3f}", flush=True)
        print(json.dumps({"ref": ref, "records": records, "runs": runs, "load": round(os.getloadavg()[0], 2),
                          "cpus": os.cpu_count()}))
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    if "--write-once" in sys.argv:
        log, n, key = sys.argv[sys.argv.index("--write-once") + 1 :][:3]
        write(Path(log), int(n), "flush", Path(key))
        return
    if "--verify-once" in sys.argv:
        log, pub, workers = sys.argv[sys.argv.index("--verify-once") + 1 :][:3]
        print(verify_once(log, pub, int(workers)))
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--fsync-records", type=int, default=2_000)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--workers", default="auto", help="processes for parallel verify (default: auto, as the CLI)")
    parser.add_argument("--runs", type=int, default=5, help="verify runs per setting (best and median are shown)")
    parser.add_argument("--compare", metavar="REV", help="verify before (git revision REV) and after, alternating")
    args = parser.parse_args()
    if args.compare:
        compare(args.compare, args.records, args.runs, args.dir)
        return
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        d = Path(tmp)
        key, pub, _ = generate_keypair(d / "key")
        fs = write(d / "fsync.jsonl", args.fsync_records, "fsync", key)
        print(f"write, fsync per record : {fs:>10,.0f} records/s ({1e6 / fs:,.0f} µs/record, "
              f"{args.fsync_records} records)")
        fl = write(d / "flush.jsonl", args.records, "flush", key)
        print(f"write, flush only       : {fl:>10,.0f} records/s ({1e6 / fl:,.1f} µs/record, {args.records} records)")
        log = d / "flush.jsonl"
        size = os.path.getsize(log)
        parallel: int | Literal["auto"] = "auto" if args.workers == "auto" else int(args.workers)
        for workers in (1, parallel):
            label = f"auto = {auto_workers()}" if workers == "auto" else str(workers)
            rates = []
            for _ in range(args.runs):
                start = time.perf_counter()
                report = verify(log, pubkey=pub, workers=workers)
                elapsed = time.perf_counter() - start
                assert report.ok, report.failure
                rates.append(report.records / elapsed)
            best, median = max(rates), statistics.median(rates)
            print(f"verify, {label} process(es) : {best:>10,.0f} records/s best, {median:,.0f} median of "
                  f"{args.runs} ({1e6 / best:.1f} µs/record; {report.records} records, "
                  f"{size / report.records:.0f} bytes/record, {size / 1e6 / (report.records / best):.0f} MB/s)")


if __name__ == "__main__":
    main()
