"""What provenance costs: indexing a 100 KB result, and a `provenance()` decision at call #1,000 of a
run whose labelled results hold 1 MB of text (issue #19: ≤ 2 ms and ≤ 10 µs).

Run by hand: `.venv/bin/python bench/provenance.py [--compare REV]`. Times are CPU time of the
measuring process (`time.process_time`), so a loaded or CPU-throttled machine does not inflate them;
each figure is the best of several repetitions, and the decision is printed next to the same decision
without the provenance condition (side by side, one run), so the difference is what to compare.
With `--compare REV` the same measurements run for the `proctor` package of git revision REV and for
this tree, each in its own process, alternately (two rounds, best of each), and are printed side by
side with their ratio and issue #19's targets. REV's side is a `git archive` of its `proctor` package, so
it runs without C extensions (the provenance tokeniser `proctor._provtok` included): pure Python.

Texts: "mail" is realistic — e-mails as JSON with senders, ids, dates, amounts and prose (about one
token per 60 characters); "dense" holds a distinct address and a distinct number every ~40
characters, the worst case for the tokenizer and the digests; "page" is a listing of addresses,
URLs, IBANs and amounts; "words" is random prose (no tokens at all); "cjk" is mail in Chinese (non-ASCII text:
the fold's own cost); "digits" is the hostile `"1 " * 50000` (a number laid out in groups without end); "table"
is a tab-separated table of numbers, where every run of 2 to 12 neighbouring numbers is also a number laid out
in groups: ~180,000 joined forms, more than `max_joined_forms`, so none of them is indexed and the result's labels
go to every argument that could be such a number (docs/policy.md, "Tables of numbers").

Field-level sources (docs/policy.md): "phrases TEXT" indexes the text with its runs of two to four words too (a
tool's `sources: {phrases: true}`), next to "index TEXT" without; "fields events" indexes 600 calendar events
(~100 KB) with labels by field path, next to the same list under one set of labels, and "fields events with
records" keeping its records too (a policy calling `same_record`/`same_call`); the two text_provenance()
lookups are made at call #1,000 of a run whose 999 results (1 MB) were indexed with and without phrases.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from proctor.calls import Call
from proctor.gate import Gate
from proctor.policy import Policy
from proctor.provenance import ProvenanceIndex
from proctor.tools import tool

WORDS = ("the meeting notes are attached please review before friday and send comments to the team about "
         "budget planning quarterly report customer feedback project timeline").split()


def _lines(size: int, seed: int, line: Callable[[random.Random], str]) -> str:
    """`size` characters of lines made by `line` from one seeded generator."""
    rng = random.Random(seed)
    out, n = [], 0
    while n < size:
        item = line(rng)
        out.append(item)
        n += len(item)
    return "".join(out)[:size]


def _mail_line(rng: random.Random) -> str:
    body = " ".join(rng.choice(WORDS) for _ in range(40))
    return (f'{{"id_": "{rng.randint(1, 10**6)}", "sender": "user{rng.randint(1, 500)}@mail.example", '
            f'"subject": "Re: invoice INV-{rng.randint(1000, 9999)}", "timestamp": "2024-05-{rng.randint(10, 28)} '
            f'10:{rng.randint(10, 59)}", "body": "{body} total {rng.randint(10, 9999)}.{rng.randint(10, 99)} EUR '
            f'see https://portal.example/t/{rng.randint(1, 10**5)}"}}\n')


def _dense_line(rng: random.Random) -> str:
    return (f"{rng.choice(WORDS)} user{rng.randint(1, 10**6)}@mail{rng.randint(1, 99)}.example "
            f"{rng.randint(1, 10**5)}.{rng.randint(10, 99)}\n")


def _page_line(rng: random.Random) -> str:
    return (f"{rng.choice(WORDS).title()} <ops{rng.randint(1, 10**6)}@vendor{rng.randint(1, 999)}.example> "
            f"https://www.shop{rng.randint(1, 999)}.example/order?id={rng.randint(1, 10**6)} "
            f"GB{rng.randint(10, 99)} NWBK {rng.randint(1000, 9999)} {rng.randint(1000, 9999)} "
            f"{rng.randint(10, 99)} ; due {rng.randint(1, 99999):,}.{rng.randint(10, 99)} EUR\n")


def mail_text(size: int, seed: int = 1) -> str:
    return _lines(size, seed, _mail_line)


def dense_text(size: int, seed: int = 1) -> str:
    return _lines(size, seed, _dense_line)


def page_text(size: int, seed: int = 1) -> str:
    return _lines(size, seed, _page_line)


def words_text(size: int, seed: int = 1) -> str:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    out, n = [], 0
    while n < size:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(2, 11)))
        out.append(word)
        n += len(word) + 1
    return " ".join(out)[:size]


def _cjk_line(rng: random.Random) -> str:
    words = "请把 账单 发送 到 合作 支持 金额 元 谢谢 您的 会议 记录 已 附上 请 在 周五 之前 审阅".split()
    return (f"发件人 user{rng.randint(1, 500)}@mail.example:{''.join(rng.choice(words) for _ in range(30))},"
            f"金额 {rng.randint(10, 9999)} 元,单号 INV-{rng.randint(1000, 9999)}。\n")


def cjk_text(size: int, seed: int = 1) -> str:
    return _lines(size, seed, _cjk_line)


def digits_text(size: int, seed: int = 1) -> str:
    return ("1 " * (size // 2 + 1))[:size]


def table_text(size: int, seed: int = 1) -> str:
    return _lines(size, seed, lambda rng: "\t".join(str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(8))
                  + "\n")


TEXTS = {"mail": mail_text, "dense": dense_text, "page": page_text, "words": words_text, "cjk": cjk_text,
         "digits": digits_text, "table": table_text}


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
# The same condition with a term only CEL can evaluate: the provenance calls are answered before CEL runs
# (hidden variables), and CEL evaluates the rest.
MIXED = POLICY.replace("!from_user(args.to)\"", "!from_user(args.to) && size(args.to) > 0\"")
PLAIN = POLICY.replace("\"'untrusted' in provenance(args.to) && !from_user(args.to)\"",
                       "\"args.to == 'x@evil.example'\"")


def measure() -> dict[str, float]:
    """Every figure, in seconds of CPU time: indexing each text, and the two decisions."""
    figures: dict[str, float] = {}
    for name, make in TEXTS.items():
        text = make(100_000)
        figures[f"index {name}"] = best(lambda text=text: ProvenanceIndex().add(text, ["untrusted"]))
        entries = ProvenanceIndex()
        entries.add(text, ["untrusted"])
        figures[f"entries {name}"] = len(entries)
    for label, text in (("provenance()", POLICY), ("provenance() in CEL", MIXED), ("plain condition", PLAIN)):
        gate = Gate(Policy.from_string(text), tools=[read_inbox, send_email])
        ctx = gate.start_run(task="Summarise my inbox and mail it to bob@corp.example")
        for page in range(999):
            gate.call("read_inbox", {"page": page}, context=ctx)
        policy = gate.policy
        call = Call("send_email", {"to": "user42@mail.example", "body": "hi"}, side_effect="external",
                    history=ctx.history_view(), run=ctx.info, seen=ctx.seen_labels(), provenance=ctx.provenance)
        assert isinstance(policy, Policy)
        figures[f"decide {label}"] = best(lambda policy=policy, call=call: policy.decide(call), number=2000)
    figures["provenance() extra"] = figures["decide provenance()"] - figures["decide plain condition"]
    figures["provenance() in CEL extra"] = figures["decide provenance() in CEL"] - figures["decide plain condition"]
    if hasattr(ProvenanceIndex, "add_result"):  # (a revision before field-level sources has neither figure)
        figures.update(_field_figures())
    return figures


def _field_figures() -> dict[str, float]:
    """Phrases (a tool's `sources: {phrases: true}`) and labels by field path, next to the plain index."""
    from proctor.provenance import ResultPlan

    class Plan:
        def __init__(self, plan: ResultPlan) -> None:
            self._plan = plan

        def plan(self, tool: str, args: object, index: ProvenanceIndex) -> ResultPlan:
            return self._plan

    figures: dict[str, float] = {}
    phrases = Plan(ResultPlan(("untrusted",), (), True))
    for name in ("mail", "page", "words"):
        text = TEXTS[name](100_000)
        figures[f"phrases {name}"] = best(
            lambda text=text: ProvenanceIndex().add_result(text, ["untrusted"], phrases, {}, tool="t"))
        entries = ProvenanceIndex()
        entries.add_result(text, ["untrusted"], phrases, {}, tool="t")
        figures[f"entries phrases {name}"] = len(entries)
    rng = random.Random(7)
    events = [{"id_": str(i), "title": " ".join(rng.choice(WORDS) for _ in range(4)),
               "participants": [f"user{rng.randint(1, 500)}@mail.example" for _ in range(3)],
               "description": " ".join(rng.choice(WORDS) for _ in range(12))} for i in range(600)]  # ~100 KB
    paths = ((("[]", "id_"), ("event_id",)), (("[]", "participants", "[]"), ("directory",)))
    by_field = Plan(ResultPlan(("untrusted",), paths))
    figures["fields events (plain)"] = best(lambda: ProvenanceIndex().add(events, ["untrusted"]))
    figures["fields events"] = best(
        lambda: ProvenanceIndex().add_result(events, ["untrusted", "event_id", "directory"], by_field, {},
                                             tool="search_calendar_events"))
    try:  # (a revision before records: no such figure on its side)
        with_records = Plan(ResultPlan(("untrusted",), paths, records=True))  # type: ignore[call-arg, unused-ignore]
    except TypeError:
        with_records = None
    if with_records is not None:
        figures["fields events with records"] = best(
            lambda: ProvenanceIndex().add_result(events, ["untrusted", "event_id", "directory"], with_records, {},
                                                 tool="search_calendar_events"))
    index = ProvenanceIndex()
    index.add("Summarise my inbox", ("user",))
    for page in PAGES[:999]:
        index.add_result(page, ["untrusted"], phrases, {}, tool="read_inbox")
    title = "Re: please review the budget planning before friday"
    figures["decide text_provenance() with phrases"] = best(lambda: index.text_labels(title), number=2000)
    plain = ProvenanceIndex()
    plain.add("Summarise my inbox", ("user",))
    for page in PAGES[:999]:
        plain.add(page, ["untrusted"])
    figures["decide text_provenance() plain"] = best(lambda: plain.text_labels(title), number=2000)
    return figures


TARGETS = {"index": 2e-3, "provenance() extra": 10e-6, "provenance() in CEL extra": 10e-6}


def _target(key: str) -> float | None:
    return TARGETS.get(key, TARGETS["index"] if key.startswith("index ") else None)


def _show(key: str, value: float) -> str:
    if key.startswith("entries"):
        return f"{value:,.0f}"
    return f"{value * 1e3:.2f} ms" if key.startswith(("index", "phrases", "fields")) else f"{value * 1e6:.2f} µs"


def _run(tree: Path | None) -> dict[str, float]:
    """`measure()` in a fresh process, with the `proctor` package of `tree` (None: this tree)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--json"], env=env, check=True,
                         capture_output=True, text=True, cwd=tree or Path(__file__).resolve().parent.parent,
                         timeout=1800)
    figures: dict[str, float] = json.loads(out.stdout)
    return figures


def compare(rev: str) -> None:
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "proctor"], capture_output=True,
                                 check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        before: dict[str, float] = {}
        after: dict[str, float] = {}
        for _ in range(2):  # alternately, so a change of load touches both sides
            for side, tree in ((before, Path(tmp)), (after, None)):
                for key, value in _run(tree).items():
                    side[key] = min(side.get(key, value), value)
    print(f"provenance costs, before ({rev}) and after (this tree), CPU time, best of 2 runs x 7:")
    print(f"  {'figure':28} {'before':>12} {'after':>12} {'after/before':>13} {'target':>9}  holds")
    for key in after:
        target = _target(key)
        ratio = f"{after[key] / before[key]:.2f}x" if before.get(key) else "-"
        holds = "" if target is None else ("yes" if after[key] <= target else "no")
        print(f"  {key:28} {_show(key, before.get(key, 0.0)):>12} {_show(key, after[key]):>12} {ratio:>13} "
              f"{'' if target is None else _show(key, target):>9}  {holds}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", metavar="REV", help="also measure the proctor package of git revision REV")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.json:
        print(json.dumps(measure()))
        return
    if opts.compare:
        compare(opts.compare)
        return
    figures = measure()
    print("provenance costs (CPU time, best of 7), against issue #19's targets; a decision's 'extra' is its cost")
    print("minus the plain condition's (negative: a condition made only of provenance calls skips CEL altogether):")
    for key, value in figures.items():
        target = _target(key)
        holds = None if target is None else "holds" if value <= target else "no"
        verdict = "" if target is None else f"  (target <= {_show(key, target)}: {holds})"
        print(f"  {key:28} {_show(key, value):>12}{verdict}")


if __name__ == "__main__":
    main()
