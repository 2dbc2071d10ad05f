"""One process of many writing to a PostgreSQL audit log: `audit_writer.py URL THREADS APPENDS`."""

from __future__ import annotations

import os
import sys
import threading

from proctor.audit.postgres import PostgresAuditLog


def main() -> int:
    url, threads, appends = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    failures: list[str] = []
    with PostgresAuditLog(url, checkpoint_every=64) as log:
        def write(t: int) -> None:
            for i in range(appends):
                r = log.append("call_intent", {"call_id": f"{os.getpid()}-{t}-{i}", "run_id": "r", "tool": "t"})
                if not r.ok:
                    failures.append(str(r.error))

        workers = [threading.Thread(target=write, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    if failures:
        print(failures[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
