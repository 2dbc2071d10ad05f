"""The real tools of `analytics.yaml`: a small SQLite warehouse in memory.

    proctor policy test examples/policies/analytics.yaml examples/policies/analytics.cases.yaml \\
        --tools examples.policies.analytics_tools
"""

from __future__ import annotations

import sqlite3
import statistics
from typing import Any

from proctor import tool

__all__ = ["TOOLS"]

DB = sqlite3.connect(":memory:", check_same_thread=False)
DB.executescript("create table sales (id integer primary key, region text, amount real, email text);")


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
def run_query(sql: str, limit: int = 1000) -> list[dict[str, Any]]:
    """Run a SQL query (SELECT or WITH only) and return its rows as dicts.

    Args:
        sql: The query.
        limit: At most this many rows.
    """
    cursor = DB.execute(sql)
    names = [c[0] for c in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchmany(limit)]


@tool(side_effect="write", cost=1)
def run_statement(sql: str, schema: str = "scratch") -> str:
    """Run a statement that changes data, in one schema.

    Args:
        sql: The statement.
        schema: The schema it runs in.
    """
    return f"ran in {schema}"


@tool(side_effect="none")
def compute_stats(values: list[float]) -> dict[str, float]:
    """Mean, median and standard deviation of numbers.

    Args:
        values: The numbers.
    """
    return {"mean": statistics.mean(values), "median": statistics.median(values),
            "stdev": statistics.pstdev(values)}


@tool(side_effect="none")
def plot_chart(values: list[float], kind: str = "bar") -> str:
    """Draw a chart of numbers (returned as a description).

    Args:
        values: The numbers.
        kind: bar, line or pie.
    """
    return f"{kind} chart of {len(values)} values"


@tool(side_effect="write")
def save_scratch(table: str, rows: list[dict[str, Any]] | None = None, schema: str = "scratch") -> str:
    """Save rows as a table.

    Args:
        table: The table name.
        rows: The rows to save.
        schema: The schema to save into.
    """
    return f"saved {len(rows or [])} rows to {schema}.{table}"


@tool(side_effect="external", cost=2)
def export_csv(columns: list[str], destination: dict[str, str], rows: list[dict[str, Any]] | None = None) -> str:
    """Export rows as CSV to a destination outside the warehouse.

    Args:
        columns: Which columns to include.
        destination: Where to: {"url": "s3://reports/q3.csv", "token": "…"}.
        rows: The rows to export.
    """
    return f"exported {len(rows or [])} rows to {destination.get('url')}"


@tool(side_effect="external")
def share_dashboard(dashboard: str, with_: str) -> str:
    """Share a dashboard with someone.

    Args:
        dashboard: The dashboard id.
        with_: Their e-mail address.
    """
    return f"shared {dashboard}"


TOOLS = [list_tables, describe_table, run_query, run_statement, compute_stats, plot_chart, save_scratch, export_csv,
         share_dashboard]
