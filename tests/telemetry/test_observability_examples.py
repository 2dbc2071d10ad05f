"""The examples in examples/observability stay in step with what proctor emits (no Docker needed)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Histogram, InMemoryMetricReader, Sum
from tel_helpers import make_gate, run_two_steps

from proctor.telemetry import metrics as proctor_metrics

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "observability"
PROMQL_BUILTINS = {"sum", "by", "rate", "last_over_time", "histogram_quantile", "min", "le", "job", "instance"}


@pytest.fixture(scope="module")
def emitted() -> Iterator[dict[str, set[str]]]:
    """Prometheus series names proctor's metrics become, with the labels each carries."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    proctor_metrics.use_meter_provider(provider)
    try:
        run_two_steps(None, make_gate(None))
        data = reader.get_metrics_data()
    finally:
        proctor_metrics.use_meter_provider(None)
        provider.shutdown()
    assert data is not None
    out: dict[str, set[str]] = {}
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                # The collector's Prometheus translation: dots to underscores, unit and type suffixes.
                base = m.name.replace(".", "_") + ("_seconds" if m.unit == "s" else "")
                labels = {k.replace(".", "_") for p in m.data.data_points for k in p.attributes}
                if isinstance(m.data, Histogram):
                    names = [base + "_bucket", base + "_sum", base + "_count"]
                elif isinstance(m.data, Sum) and m.data.is_monotonic:
                    names = [base + "_total"]
                else:
                    names = [base]
                for name in names:
                    out[name] = labels
    yield out


def _dashboard() -> dict[str, Any]:
    with open(EXAMPLES / "grafana" / "dashboards" / "proctor.json") as f:
        data: dict[str, Any] = json.load(f)
    return data


def test_dashboard_queries_use_emitted_metrics_and_labels(emitted: dict[str, set[str]]) -> None:
    """Every metric and label a PromQL panel names is one proctor actually emits."""
    exprs = [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", []) if "expr" in t]
    assert len(exprs) >= 8
    for expr in exprs:
        metric_names = set(re.findall(r"\b([a-z_]+(?:_total|_bucket|_seconds_bucket|_remaining))\b", expr))
        assert metric_names, expr
        for name in metric_names:
            assert name in emitted, f"{name} is not emitted ({sorted(emitted)})"
            used = set(re.findall(r"\b([a-z][a-z_]+)\b", expr)) - PROMQL_BUILTINS - metric_names
            labels = {u for u in used if "_" in u and not u.startswith(("rate_", "range"))}
            assert labels <= emitted[name], f"{expr}: {sorted(labels - emitted[name])} not on {name}"


def test_dashboard_datasources_are_provisioned() -> None:
    """Panels point at the provisioned Prometheus and Tempo data sources by uid."""
    with open(EXAMPLES / "grafana" / "provisioning" / "datasources" / "datasources.yaml") as f:
        provisioned = {d["uid"]: d["type"] for d in yaml.safe_load(f)["datasources"]}
    used = {(p["datasource"]["uid"], p["datasource"]["type"]) for p in _dashboard()["panels"] if "datasource" in p}
    assert used == {("prometheus", "prometheus"), ("tempo", "tempo")}
    assert all(provisioned[uid] == kind for uid, kind in used)


@pytest.mark.parametrize(("compose", "service"), [("docker-compose.jaeger.yml", "jaeger"),
                                                  ("docker-compose.tempo.yml", "otel-collector")])
def test_compose_files_expose_otlp(compose: str, service: str) -> None:
    """Both stacks take OTLP on the standard ports 4317 (gRPC) and 4318 (HTTP)."""
    with open(EXAMPLES / compose) as f:
        services = yaml.safe_load(f)["services"]
    ports = {p.split(":")[0] for p in services[service]["ports"]}
    assert {"4317", "4318"} <= ports
    mounted = [v.split(":")[0] for s in services.values() for v in s.get("volumes", [])]
    assert all((EXAMPLES / m).exists() for m in mounted if m.startswith("./")), mounted
