"""A data-analysis agent over a read-only SQLite warehouse, under examples/policies/analytics.yaml.

    python examples/analytics_agent.py                               # scripted model, offline
    python examples/analytics_agent.py --model openai/gpt-4o-mini

SELECTs run, a DELETE is denied at its call site inside the program, scratch writes
are fine, an export with e-mail addresses is refused, and an aggregate export needs
an analyst's sign-off (you, on a terminal; refused otherwise).
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from proctor import tool
from proctor.agent import CodeAgent, LiteLLMModel, Model, ScriptedModel
from proctor.agent.render import StepPrinter, summary_table
from proctor.approval import Approver, CallbackApprover, ConsoleApprover
from proctor.policy import Policy
from proctor.telemetry.logging import configure_logging

HERE = Path(__file__).parent
DB = sqlite3.connect(":memory:", check_same_thread=False)
DB.executescript("""
create table orders (id integer primary key, region text, amount real, email text);
insert into orders (region, amount, email) values
  ('north', 120.0, 'a@x.example'), ('north', 80.5, 'b@x.example'), ('south', 42.0, 'c@x.example'),
  ('south', 300.0, 'd@x.example'), ('east', 99.9, 'e@x.example');
""")


@tool(side_effect="read")
def list_tables() -> list[str]:
    """Names of the warehouse tables."""
    return [r[0] for r in DB.execute("select name from sqlite_master where type = 'table'")]


@tool(side_effect="read")
def describe_table(table: str) -> list[str]:
    """Column names of a table.

    Args:
        table: The table name.
    """
    return [r[1] for r in DB.execute(f"pragma table_info({table!r})")]


@tool(side_effect="read", cost=1)
def run_query(sql: str) -> list[dict[str, Any]]:
    """Run a SQL query and return its rows as dicts.

    Args:
        sql: The query (SELECT or WITH only).
    """
    cursor = DB.execute(sql)
    names = [c[0] for c in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@tool(side_effect="none")
def compute_stats(values: list[float]) -> dict[str, float]:
    """Mean, median and standard deviation of numbers.

    Args:
        values: The numbers.
    """
    return {"mean": statistics.mean(values), "median": statistics.median(values),
            "stdev": statistics.pstdev(values)}


@tool(side_effect="external", cost=2)
def export_csv(rows: list[dict[str, Any]], columns: list[str], destination: str) -> str:
    """Export rows as CSV to a destination outside the warehouse.

    Args:
        rows: The rows to export.
        columns: Which columns to include.
        destination: Where to (e.g. "s3://reports/q3.csv").
    """
    return f"exported {len(rows)} rows to {destination}"


TASK = ("Report revenue per region with summary statistics, clean up test rows if there are any, and export "
        "the per-region totals to s3://reports/regions.csv for the finance team.")

SCRIPT = [
    '''Thought: Look at the data.
```python
print(list_tables(), describe_table("orders"))
totals = run_query("select region, sum(amount) as revenue from orders group by region order by revenue desc")
stats = compute_stats([r["revenue"] for r in totals])
print(totals, stats)
```''',
    '''Thought: The task says to clean test rows; then export, first with contacts so finance can follow up.
```python
for statement in ["delete from orders where amount < 50"]:
    try:
        run_query(statement)
    except ToolDenied as e:
        print("cleanup refused:", e)
contacts = run_query("select region, email from orders")
for attempt in [(contacts, ["region", "email"]), (totals, ["region", "revenue"])]:
    try:
        print(export_csv(rows=attempt[0], columns=attempt[1], destination="s3://reports/regions.csv"))
    except CallRefused as e:
        print("export refused:", type(e).__name__, e)
```''',
    '''Thought: Done.
```python
final_answer({"totals": totals, "stats": stats})
```''',
]


def approver(console: Console) -> Approver:
    if sys.stdin.isatty():
        return ConsoleApprover(timeout=300)
    console.print("[dim]no terminal: approval requests are refused (run on a terminal to answer them)[/]")
    return CallbackApprover(lambda request: False, name="no-terminal")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a litellm model id (default: a scripted model, offline)")
    parser.add_argument("--audit", default="analytics-audit.jsonl", help="audit log (default: %(default)s)")
    args = parser.parse_args()

    configure_logging(level="warning")
    console = Console(highlight=False)
    model: Model = LiteLLMModel(args.model) if args.model else ScriptedModel(SCRIPT, model_id="scripted-analytics")
    policy = Policy.from_yaml(HERE / "policies" / "analytics.yaml")
    printer = StepPrinter(console)
    tools = [list_tables, describe_table, run_query, compute_stats, export_csv]
    with CodeAgent(tools, model, policy, approver=approver(console), audit=args.audit, max_steps=10,
                   authorized_imports=["statistics", "math"],
                   program_callbacks=[printer.program], step_callbacks=[printer.done]) as agent:
        result = agent.run(TASK, principal="analyst@corp.example")
    console.print(summary_table(result, limits={b.name: b.limit.model_dump() for b in policy.budgets}))
    return 0 if result.status == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
