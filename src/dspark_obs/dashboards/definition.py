"""The main dashboard, "DSpark — acceptance and ceiling", built with grafana-foundation-sdk.

Every query filters on the template variables (`$instance`, `$workload`, `$mode`, `$rank`,
all multi-value with `.*` as "All") by regex, so the same PromQL runs in Grafana and, with the
variables replaced by `.*`, straight against Prometheus (which is how the tests check it).
Metric names and labels are those of `exporters/catalog.py` (docs/metrics.md).

This module puts the dashboard together (its variables, the rows of `rows` in order, stable
panel ids) and turns it into Grafana's JSON model; `panels` says how panels look,
`promql` what the queries are made of, `provisioning` writes the files Grafana loads.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from .panels import DS
from .rows import ROWS

DASHBOARD_UID = "dspark-acceptance"
TITLE = "DSpark — acceptance and ceiling"


def _variables() -> list:
    out: list = [
        dashboard.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description("Prometheus that scrapes the dspark-obs exporters.")
    ]
    for name, label, parent in (
        ("instance", "Instance", None),
        ("workload", "Workload", 'instance=~"$instance"'),
        ("mode", "Mode", 'instance=~"$instance"'),
        ("rank", "Rank", 'instance=~"$instance"'),
    ):
        series = "dspark_request_steps_total" + (f"{{{parent}}}" if parent else "")
        out.append(
            dashboard.QueryVariable(name)
            .label(label)
            .description(f"`{name}` label of dspark_request_steps_total.")
            .datasource(DS)
            .query(f"label_values({series}, {name})")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(dm.VariableSort.ALPHABETICAL_ASC)
            .multi(True)
            .include_all(True)
            .all_value(".*")
            .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        )
    return out


def build() -> dm.Dashboard:
    d = (
        dashboard.Dashboard(TITLE)
        .uid(DASHBOARD_UID)
        .description(
            "DSpark speculative decoding on SGLang: acceptance against the full-block ceiling, "
            "load, calibration, cost model, estimator health and sources (dspark-obs exporter)."
        )
        .tags(["dspark", "sglang", "speculative-decoding"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .variables(_variables())
    )
    for title, panels in ROWS:
        d = d.with_row(dashboard.Row(title))
        for panel in panels():
            d = d.with_panel(panel)
    built = d.build()
    for i, panel in enumerate(built.panels or [], start=1):
        panel.id_val = i
    return built


def generate() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a plain dict, stable from run to run)."""
    return json.loads(json.dumps(build(), cls=JSONEncoder))


def render_json() -> str:
    return json.dumps(generate(), indent=2, ensure_ascii=False) + "\n"
