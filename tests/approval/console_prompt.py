"""Run a ConsoleApprover on this process's terminal; driven by test_console_approver.py under a pty.

Usage: python console_prompt.py '{"timeout": 0.5, "expires_in": 60, "requests": 1}'
(``"await_type_ahead": true``: wait until a line is typed before asking.)
Prints one line ``DECISION:<json>`` per request answered.
"""

from __future__ import annotations

import json
import select
import sys
import threading

from approval_helpers import make_request

from proctor.approval import ApprovalDecision, ConsoleApprover


def main() -> None:
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    approver = ConsoleApprover(timeout=config.get("timeout"), approver_name=config.get("name"))
    args = config.get("args")
    requests = [
        make_request(call_id=f"call_{i}", expires_in=config.get("expires_in", 60.0), args=args)
        for i in range(config.get("requests", 1))
    ]
    results: list[ApprovalDecision] = []
    if config.get("await_type_ahead"):  # the test's keystrokes are queued before the prompt opens, however slow it is
        select.select([sys.stdin], [], [], 15)

    def ask(i: int) -> None:
        results.append(approver.request(requests[i]))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for decision in results:
        print("DECISION:" + json.dumps(decision.as_dict()), flush=True)


if __name__ == "__main__":
    main()
