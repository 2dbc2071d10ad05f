"""NFKC on hostile text: a flood of combining marks out of order stays linear, real text normalises as before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proctor.policy.functions import normalize
from proctor.provenance import normalize_whole
from proctor.unicodenorm import MAX_NON_STARTERS, nfkc, stream_safe

_MARKS = "\u0301\u0323\u0308\u0327\u05b0\u05c2\u0e48\u302a\U0001d165\U0001e8d0"


def _longest_run_of_marks(text: str) -> int:
    longest = run = 0
    for ch in text:
        run = run + 1 if unicodedata.combining(ch) else 0
        longest = max(longest, run)
    return longest


@given(st.lists(st.tuples(st.sampled_from("aé你Ж\U0001f600 1@."), st.text(alphabet=_MARKS, max_size=MAX_NON_STARTERS)),
                max_size=30))
def test_text_without_a_long_run_of_marks_normalises_exactly_as_before(parts: list[tuple[str, str]]) -> None:
    """Up to 30 marks on a character (far more than any script uses): nfkc is unicodedata's NFKC, unchanged."""
    text = "".join(base + marks for base, marks in parts)
    assert stream_safe(text) == text
    assert nfkc(text) == unicodedata.normalize("NFKC", text)


@given(st.text(alphabet=_MARKS, min_size=MAX_NON_STARTERS + 1, max_size=300), st.sampled_from("a\U0001f600"))
def test_a_long_run_of_marks_is_cut_by_grapheme_joiners_every_thirty(marks: str, base: str) -> None:
    """Any longer run gets a U+034F after each 30 marks, and what NFKC gives has no run over 30 either."""
    text = base + marks
    safe = stream_safe(text)
    assert safe.replace("\u034f", "") == text
    assert _longest_run_of_marks(safe) == MAX_NON_STARTERS
    assert _longest_run_of_marks(nfkc(text)) <= MAX_NON_STARTERS


def test_normalize_and_the_provenance_fold_cut_a_flood_of_marks() -> None:
    """The CEL normalize() and provenance's whole form see a flood of marks cut into runs of at most 30."""
    flood = "eve" + "\u0301" * 5000 + "\u0323" * 5000 + "@evil.example"
    for folded in (normalize(flood), normalize_whole(flood)):
        assert folded.startswith("ev") and folded.endswith("@evil.example")
        assert _longest_run_of_marks(folded) <= MAX_NON_STARTERS


# A program's argument and a tool's result, each ~900 KB of marks in reverse canonical order: with
# CPython's insertion sort that is minutes of CPU under the GIL (every run of the host frozen); cut
# into stream-safe runs, well under a second. The child is killed at the timeout if it hangs.
_FLOOD = textwrap.dedent("""\
    import json
    from proctor import Gate, Policy, tool

    @tool(side_effect="read")
    def read_page(url: str) -> str:
        '''Read a page.

        Args:
            url: Page.
        '''
        return "a" + "\\u0301" * 225_000 + "\\u0323" * 225_000 + " eve@evil.example"

    @tool(side_effect="external")
    def send(to: str) -> str:
        '''Send.

        Args:
            to: Who.
        '''
        return "sent"

    policy = Policy.from_string('''
    version: 1
    default: allow
    tools:
      read_page: {side_effect: read, labels: [untrusted]}
    rules:
      - name: corp-only
        match: {tool: send}
        when: "!email_domain(args.to).endsWith('corp.example')"
        decision: deny
        reason: outside
      - name: injected
        match: {tool: send}
        when: "'untrusted' in provenance(args.to)"
        decision: deny
        reason: injected
    ''')
    gate = Gate(policy, tools=[read_page, send])
    ctx = gate.start_run(task="read the page")
    gate.call("read_page", {"url": "https://news.example"}, context=ctx)
    out = gate.submit("send", {"to": "a" + "\\u0301" * 225_000 + "\\u0323" * 225_000 + "@corp.example"}, context=ctx)
    print(json.dumps([out.record.status, ctx.provenance.labels_of("eve@evil.example")]))
""")


@pytest.mark.process
def test_a_flood_of_marks_in_an_argument_or_a_result_does_not_stall_the_gate() -> None:
    """A ~900 KB flood of out-of-order marks through email_domain() and the provenance index is decided at once."""
    proc = subprocess.run([sys.executable, "-c", _FLOOD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    status, labels = json.loads(proc.stdout.strip().splitlines()[-1])
    assert status == "ok" and labels == ["untrusted"]


def test_astral_runs_are_cut_only_where_they_hold_marks() -> None:
    """A run of emoji is left as it is; a run of astral combining marks (U+1D167) is cut every thirty."""
    emoji = "\U0001f600" * 100
    assert stream_safe(emoji) == emoji
    marks = "a" + "\U0001d167" * 100
    assert stream_safe(marks).count("\u034f") == 3
    mixed = "a" + ("\U0001f600" + "\U0001d167" * 40) * 2
    assert stream_safe(mixed).count("\u034f") == 2
