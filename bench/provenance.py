"""What provenance costs: indexing a 100 KB result, and a `provenance()` decision at call #1,000 of a
run whose labelled results hold 1 MB of text (issue #19: ≤ 2 ms and ≤ 10 µs).

Run by hand: `.venv/bin/python bench/provenance.py`. Times are CPU time of this process
(`time.process_time`), so a loaded or CPU-throttled machine does not inflate them; each figure is the
best of several repetitions, and is printed next to the same decision without the provenance
condition (side by side, one run) so the ratio is what to compare across machines.

Texts: "mail" is realistic — e-mails as JSON with senders, ids, dates, amounts and prose (about one
token per 60 characters); "dense" holds a distinct address and a distinct number every ~40
characters, the worst case for the tokenizer and the digests.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from proctor.calls import Call
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.provenance import ProvenanceIndex
from proctor.tools import tool

WORDS = ("the meeting notes are attached please review before friday and send comments to the team about "
         "budget planning quarterly report customer feedback project timeline").split()


def mail_text(size: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    out, n = [], 0
    while n < size:
        body = " ".join(rng.choice(WORDS) for _ in range(40))
        item = (f'{{"id_": "{rng.randint(1, 10**6)}", "sender": "user{rng.randint(1, 500)}@mail.example", '
                f'"subject": "Re: invoice INV-{rng.randint(1000, 9999)}", "timestamp": "2024-05-{rng.randint(10, 28)} '
                f'10:{rng.randint(10, 59)}", "body": "{body} total {rng.randint(10, 9999)}.{rng.randint(10, 99)} EUR '
                f'see https://portal.example/t/{rng.randint(1, 10**5)}"}}\n')
        out.append(item)
        n += len(item)
    return "".join(out)[:size]


def dense_text(size: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    out, n = [], 0
    while n < size:
        item = (f"{rng.choice(WORDS)} user{rng.randint(1, 10**6)}@mail{rng.randint(1, 99)}.example "
                f"{rng.randint(1, 10**5)}.{rng.randint(10, 99)}\n")
        out.append(item)
        n += len(item)
    return "".join(out)[:size]


def best(fn: Callable[[], object], repeat: int = 7, number: int = 1) -> float:
    """Best CPU seconds per call of `fn`."""
    times = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            fn()
        times.append((time.process_time() - start) / number)
    return min(times)


@tool(side_effect="read")
def read_inbox(page: int) -> str:
    """Read a page of the inbox.

    Args:
        page: Page number.
    """
    return PAGES[page % len(PAGES)]


@tool(side_effect="external")
def send_email(to: str, body: str) -> str:
    """Send an email.

    Args:
        to: Recipient.
        body: Text.
    """
    return "sent"


PAGES = [mail_text(1_000, seed=i) for i in range(1000)]  # 1,000 results, 1 MB of text in all
POLICY = """
version: 1
tools:
  read_inbox: {side_effect: read, labels: [untrusted]}
  send_email: {side_effect: external}
rules:
  - {name: reads, match: {side_effect: read}, decision: allow}
  - {name: mail, match: {tool: send_email}, decision: allow}
  - name: injected
    match: {tool: send_email}
    when: "'untrusted' in provenance(args.to) && !from_user(args.to)"
    decision: require_approval
"""
PLAIN = POLICY.replace("\"'untrusted' in provenance(args.to) && !from_user(args.to)\"",
                       "\"args.to == 'x@evil.example'\"")


def main() -> None:
    print("indexing one result (CPU time, best of 7):")
    for name, make in (("mail", mail_text), ("dense", dense_text)):
        text = make(100_000)
        cost = best(lambda text=text: ProvenanceIndex().add(text, ["untrusted"]))
        entries = ProvenanceIndex()
        entries.add(text, ["untrusted"])
        print(f"  100 KB {name:5}: {cost * 1e3:6.2f} ms  ({len(entries)} entries)")
    print("a decision at call #1,000 of a run whose labelled results hold 1 MB of text:")
    figures = {}
    for label, text in (("provenance()", POLICY), ("plain condition", PLAIN)):
        gate = Gate(Policy.from_string(text), tools=[read_inbox, send_email])
        ctx = gate.start_run(task="Summarise my inbox and mail it to bob@corp.example")
        for page in range(999):
            gate.call("read_inbox", {"page": page}, context=ctx)
        policy = gate.policy
        call = Call("send_email", {"to": "user42@mail.example", "body": "hi"}, side_effect="external",
                    history=ctx.history_view(), run=ctx.info, seen=ctx.seen_labels(), provenance=ctx.provenance)
        assert isinstance(policy, Policy)
        figures[label] = best(lambda policy=policy, call=call: policy.decide(call), number=2000)
        print(f"  Policy.decide with {label:16}: {figures[label] * 1e6:6.2f} µs"
              + (f"  (index: {len(ctx.provenance)} entries)" if ctx.provenance is not None else ""))
    extra = figures["provenance()"] - figures["plain condition"]
    print(f"  the provenance() condition costs {extra * 1e6:.2f} µs more "
          f"({figures['provenance()'] / figures['plain condition']:.2f}x the plain decision)")


if __name__ == "__main__":
    main()
