"""A host or address glued to the next sentence by its full stop (``www.our-company.com.They``) is found as the
host alone, by both tokenisers, without splitting hosts such as ``example.com.au``."""

from __future__ import annotations

import pytest

from proctor import provenance
from proctor.provenance import USER, ProvenanceIndex, tokens

# Each test runs with the C tokeniser and with the pure-Python one (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("tokeniser")


def test_a_sentence_glued_to_a_host_leaves_the_host_a_token() -> None:
    found = tokens("Our site is www.our-company.com.They said so")
    assert {"www.our-company.com", "our-company.com"} <= found
    assert "www.our-company.com.they" in found  # the glued spelling is still traced
    assert "bob@acme.co.uk" in tokens("write to bob@acme.co.uk.Thanks")
    assert "https://x.example/a" in tokens("see https://x.example/a.Then go")


def test_hosts_with_lower_case_labels_are_never_split() -> None:
    found = tokens("shop at www.example.com.au today, or mail eve@evil.com.au")
    assert "www.example.com.au" in found and "eve@evil.com.au" in found
    assert "www.example.com" not in found and "evil.com" not in found
    assert "example.com" not in tokens("Example.Com.They")  # one label before the dot: no host to split off


def test_the_task_and_results_index_the_host() -> None:
    index = ProvenanceIndex()
    index.add("Summarise the page at www.our-company.com.They asked for it", (USER,))
    assert index.from_user("www.our-company.com")
    assert index.from_user("https://www.our-company.com") is False  # a scheme the user did not write
    assert not index.from_user("www.our-company.co")
    index.add({"body": "Reply to eve@evil.example.Thanks!"}, ("untrusted",))
    assert index.labels_of("eve@evil.example") == ["untrusted"]
    assert index.labels_of("Eve@Evil.example") == ["untrusted"]


def test_both_tokenisers_agree_on_glued_text(monkeypatch: pytest.MonkeyPatch) -> None:
    texts = ["a www.our-company.com.They b", "x.co.uk.I", "mail me at a@b.example.Now or a@b.example.au.Then",
             "e.g.The end", "v1.2.Final", "https://h.example:8080/p?q=1.Next"]
    with_c = [provenance._analyze_text(t) for t in texts]
    monkeypatch.setattr(provenance, "_native", None)
    assert [provenance._analyze_text(t) for t in texts] == with_c
