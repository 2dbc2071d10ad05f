"""Results and arguments cross as smolagents users expect: a tool's DataFrame, ndarray, date, Decimal, set or
PIL image reaches the program as that object; ``additional_args`` objects too; ``final_answer(df)`` returns df.
A result that cannot cross is refused before the tool runs when its annotation says so, and otherwise is
reported as delivered-but-unusable, the call recorded as having run."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import numpy as np
import pandas as pd
import pytest
import smolagents
from PIL import Image
from smolagents import tool

from integrations.smol_tools import ScriptedSmolModel
from proctor import Gate, Policy
from proctor.integrations.smolagents import GovernedExecutor
from proctor.interpreter.result import ProgramError
from proctor.testing import InMemoryAudit

RAN: list[str] = []


@tool  # smolagents warns about any other spelling of its decorator
def load_sales(region: str) -> pd.DataFrame:
    """Sales of a region.

    Args:
        region: The region.
    """
    RAN.append("load_sales")
    return pd.DataFrame({"team": ["a", "b", "a"], "amount": [3.0, 4.0, 5.0],
                         "day": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"])})


@tool
def odds_and_ends(kind: str) -> Any:
    """Values of many kinds.

    Args:
        kind: Which.
    """
    RAN.append("odds_and_ends")
    return {"array": np.arange(6).reshape(2, 3), "date": dt.date(2024, 5, 1), "when": dt.datetime(2024, 5, 1, 12),
            "price": decimal.Decimal("19.90"), "raw": b"\x00\x01", "tags": {"x", "y"},
            "series": pd.Series([1, 2], name="n"), "image": Image.new("RGB", (4, 3), (9, 8, 7))}


class Opaque:
    pass


@tool
def opaque(kind: str) -> Opaque:
    """Returns something no program can hold.

    Args:
        kind: Which.
    """
    RAN.append("opaque")
    return Opaque()


@tool
def sneaky(kind: str) -> Any:
    """Returns something no program can hold, without saying so.

    Args:
        kind: Which.
    """
    RAN.append("sneaky")
    return Opaque()


POLICY = Policy.from_dict({"version": 1, "default": "allow"})


def code(body: str) -> str:
    return f"Thought: go.\n<code>\n{body}\n</code>"


def make_agent(replies: list[str], tools: list[Any], imports: list[str], audit: InMemoryAudit | None = None,
               ) -> Any:
    executor = GovernedExecutor(Gate(POLICY, audit=audit), sandbox="process", timeout=60)
    return smolagents.CodeAgent(tools=tools, model=ScriptedSmolModel(replies), executor=executor,
                                additional_authorized_imports=imports)


def test_a_dataframe_result_reaches_the_program_as_a_dataframe_and_final_answer_returns_one() -> None:
    RAN.clear()
    agent = make_agent([code(
        "df = load_sales('north')\n"
        "print(type(df).__name__, df.groupby('team')['amount'].sum().to_dict(), df['day'].dt.day.tolist())\n"
        "final_answer(df[df.amount > 3])")], [load_sales], ["pandas"])
    try:
        answer = agent.run("sales")
    finally:
        agent.cleanup()
    assert isinstance(answer, pd.DataFrame)
    assert answer["amount"].tolist() == [4.0, 5.0] and answer.index.tolist() == [1, 2]
    logs = agent.memory.steps[-1].observations
    assert "DataFrame {'a': 8.0, 'b': 4.0} [1, 2, 3]" in logs


def test_every_rich_value_reaches_the_program_as_itself() -> None:
    program = (
        "v = odds_and_ends('all')\n"
        "print(type(v['array']).__name__, v['array'].sum(), v['array'].shape)\n"
        "print(v['date'].isoformat(), v['when'].hour, v['price'] * 2, v['raw'][1], sorted(v['tags']))\n"
        "print(type(v['series']).__name__, v['series'].mean(), v['image'].size, v['image'].getpixel((0, 0)))\n"
        "final_answer(v)")
    agent = make_agent([code(program)], [odds_and_ends], ["numpy", "pandas", "PIL.*"])
    try:
        answer = agent.run("values")
    finally:
        agent.cleanup()
    logs = agent.memory.steps[-1].observations
    assert "ndarray 15 (2, 3)" in logs
    assert "2024-05-01 12 39.80 1 ['x', 'y']" in logs
    assert "Series 1.5 (4, 3) (9, 8, 7)" in logs
    assert isinstance(answer["price"], decimal.Decimal) and isinstance(answer["image"], Image.Image)
    assert isinstance(answer["array"], np.ndarray) and answer["tags"] == {"x", "y"}


def test_additional_args_objects_arrive_as_objects() -> None:
    df = pd.DataFrame({"x": [1, 2, 3]})
    agent = make_agent([code("final_answer((type(df).__name__, int(df.x.sum()), day.year, arr.dtype.name))")],
                       [], ["pandas", "numpy"])
    try:
        answer = agent.run("use them", additional_args={"df": df, "day": dt.date(2030, 1, 1),
                                                        "arr": np.ones(2, dtype="float32")})
    finally:
        agent.cleanup()
    assert tuple(answer) == ("DataFrame", 6, 2030, "float32")


def test_a_result_the_annotation_says_cannot_cross_is_refused_before_the_tool_runs() -> None:
    RAN.clear()
    audit = InMemoryAudit()
    executor = GovernedExecutor(Gate(POLICY, audit=audit), sandbox="process")
    try:
        executor.send_tools({"opaque": opaque, "load_sales": load_sales})
        with pytest.raises(ProgramError, match=r"opaque: refused before it ran: its result, a Opaque, cannot be sent"):
            executor("opaque('x')")
        with pytest.raises(ProgramError, match=r"authorized_imports=\['pandas'\]"):
            executor("load_sales('north')")  # pandas not authorized: the sandbox could not receive a DataFrame
    finally:
        executor.cleanup()
    assert RAN == []
    assert [r["status"] for r in audit.of_kind("call_outcome")] == ["denied", "denied"]


def test_a_result_that_cannot_cross_after_all_is_reported_as_delivered_but_unusable() -> None:
    RAN.clear()
    audit = InMemoryAudit()
    executor = GovernedExecutor(Gate(POLICY, audit=audit), sandbox="process")
    try:
        executor.send_tools({"sneaky": sneaky})
        with pytest.raises(ProgramError, match=r"sneaky: ran, but its result of type Opaque cannot be sent"):
            executor("sneaky('x')")
    finally:
        executor.cleanup()
    assert RAN == ["sneaky"]
    assert [r["status"] for r in audit.of_kind("call_outcome")] == ["ok"]  # it ran: recorded as such
