"""Tests that every way a program can call a tool is seen by the gate and listed in order."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from conftest import REAL_RUNS

from proctor.interpreter import Interpreter
from proctor.testing import InMemoryAudit

CASES = {
    "direct": ("lookup('a')\nlookup('b')", ["a", "b"]),
    "aliased": ("f = lookup\ng = f\ng('a')\nh = {'x': lookup}['x']\nh(order='b')", ["a", "b"]),
    "comprehension": ("[lookup(o) for o in ['a', 'b']]\n{o: lookup(o) for o in ['c']}\n"
                      "list(lookup(o) for o in ['d'])", ["a", "b", "c", "d"]),
    "map_filter": ("list(map(lookup, ['a', 'b']))\nlist(filter(lambda o: lookup(o), ['c']))", ["a", "b", "c"]),
    "sorted_key": ("sorted(['b', 'a'], key=lambda o: lookup(o))\nmax(['c'], key=lookup)", ["b", "a", "c"]),
    "nested_functions": ("def outer(o):\n    def inner(p):\n        return lookup(p)\n    return inner(o)\n"
                         "outer('a')\n(lambda: outer('b'))()", ["a", "b"]),
    "class_methods": ("class Shop:\n    def __init__(self, fn):\n        self.fn = fn\n"
                      "    def get(self, o):\n        return self.fn(o)\n    @staticmethod\n"
                      "    def st(o):\n        return lookup(o)\n    @property\n    def first(self):\n"
                      "        return lookup('c')\nShop(lookup).get('a')\nShop.st('b')\nShop(None).first",
                      ["a", "b", "c"]),
    "generator_and_decorator": ("def deco(fn):\n    def wrap(*a):\n        return fn(*a)\n    return wrap\n"
                                "w = deco(lookup)\nw('a')\ndef gen():\n    yield lookup('b')\nnext(gen())",
                                ["a", "b"]),
    "exception_handler": ("try:\n    1/0\nexcept ZeroDivisionError:\n    lookup('a')\nfinally:\n    lookup('b')",
                          ["a", "b"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_call_path_reaches_the_gate_in_order(py: Interpreter, audit: InMemoryAudit, name: str) -> None:
    """Direct, aliased, comprehension, map/filter, sorted(key=), nested, method calls: all recorded in order."""
    code, expected = CASES[name]
    before = REAL_RUNS["lookup"]
    r = py.run(code)
    assert r.error is None, r.error
    assert [(c.tool, c.args["order"], c.status) for c in r.tool_calls] == [("lookup", o, "ok") for o in expected]
    assert REAL_RUNS["lookup"] - before == len(expected)
    intents = [rec["args"]["order"] for rec in audit.of_kind("call_intent")]
    assert intents == expected


def test_threads_calling_tools_are_all_recorded(make: Callable[..., Interpreter], audit: InMemoryAudit) -> None:
    """Concurrent calls from threads (threading authorized) each get their own reply, all recorded."""
    py = make(sandbox="process", authorized_imports=["threading"])
    code = ("import threading\nout = {}\ndef work(i):\n    out[i] = lookup(str(i))\n"
            "ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]\n"
            "for t in ts:\n    t.start()\nfor t in ts:\n    t.join()\nsorted(out.items())")
    r = py.run(code)
    assert r.error is None
    assert r.value == [(i, f"order {i}: shipped") for i in range(8)]
    assert sorted(c.args["order"] for c in r.tool_calls) == [str(i) for i in range(8)]
    assert [rec["args"]["order"] for rec in audit.of_kind("call_intent")] == [c.args["order"] for c in r.tool_calls]


def test_calls_in_order_across_denials(py: Interpreter) -> None:
    """Allowed and denied calls interleave in tool_calls exactly as the program made them."""
    r = py.run("for t in ['a', 'x', 'b']:\n    try:\n        (wipe if t == 'x' else lookup)(t)\n"
               "    except ToolDenied:\n        pass")
    assert [(c.tool, c.status) for c in r.tool_calls] == [("lookup", "ok"), ("wipe", "denied"), ("lookup", "ok")]
    assert all(c.decision is not None for c in r.tool_calls)
