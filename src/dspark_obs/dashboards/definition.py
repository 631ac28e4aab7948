"""The main dashboard, "DSpark — acceptance and ceiling", built with grafana-foundation-sdk.

Every query filters on the template variables (`$engine`, `$model_name`, `$instance`,
`$workload`, `$mode`, `$rank`,
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


def datasource_variable(description: str):
    return (
        dashboard.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .description(description)
    )


def query_variable(name: str, label: str, series: str):
    """A multi-value variable of one label's values on `series`, "All" matching `.*`."""
    metric = series.split("{")[0]
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .description(f"`{name}` label of {metric}.")
        .datasource(DS)
        .query(f"label_values({series}, {name})")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text="All", value="$__all"))
    )


def _variables() -> list:
    out: list = [datasource_variable("Prometheus that scrapes the dspark-obs exporters.")]
    model = 'engine=~"$engine", model_name=~"$model_name"'
    for name, label, parent in (
        ("engine", "Engine", None),
        ("model_name", "Model", 'engine=~"$engine"'),
        ("instance", "Instance", model),
        ("workload", "Workload", f'{model}, instance=~"$instance"'),
        ("mode", "Mode", f'{model}, instance=~"$instance"'),
        ("rank", "Rank", f'{model}, instance=~"$instance"'),
    ):
        series = "dspark_request_steps_total" + (f"{{{parent}}}" if parent else "")
        out.append(query_variable(name, label, series))
    return out


def assemble(
    title: str, uid: str, description: str, tags: list[str], variables: list, rows
) -> dm.Dashboard:
    """A dashboard of this project's look (refresh, range, shared crosshair) holding each
    row of `rows` ((title, panels function) pairs) in order, panel ids from 1."""
    d = (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(tags)
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .variables(variables)
    )
    for row_title, panels in rows:
        d = d.with_row(dashboard.Row(row_title))
        for panel in panels():
            d = d.with_panel(panel)
    built = d.build()
    for i, panel in enumerate(built.panels or [], start=1):
        panel.id_val = i
    return built


def build() -> dm.Dashboard:
    return assemble(
        TITLE,
        DASHBOARD_UID,
        "DSpark speculative decoding on SGLang: acceptance against the full-block ceiling, "
        "load, calibration, cost model, estimator health and sources (dspark-obs exporter).",
        ["dspark", "sglang", "speculative-decoding"],
        _variables(),
        ROWS,
    )


def to_dict(built: dm.Dashboard) -> dict[str, Any]:
    """A built dashboard as Grafana's JSON model (a plain dict, stable from run to run)."""
    return json.loads(json.dumps(built, cls=JSONEncoder))


def to_json(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"


def generate() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model (a plain dict, stable from run to run)."""
    return to_dict(build())


def render_json() -> str:
    return to_json(generate())
