"""The fleet dashboard, "DSpark — fleet": fleet, per-node and per-rank views of every figure.

Beside the main dashboard (one exporter's view, `definition`), for a Prometheus where many
exporters' series meet: a global server federating fleet.yml's `instance:` sums with their
`cluster` label, or the one server of a small fleet with fleet.yml loaded. Its variables
follow `cluster`, `instance` (the node's exporter), `workload` and `mode`, read from the node
sums; `rank` from the exporters' own counters, which only the per-rank row reads. "All" is
`.*`, which also matches a series without the label (a `cluster` set only on federation).
"""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.models import dashboard as dm

from .definition import assemble, datasource_variable, query_variable, to_dict, to_json
from .fleet_rows import ROWS

FLEET_UID = "dspark-fleet"
TITLE = "DSpark — fleet"
NODE_SERIES = "instance:dspark_request_steps:sum"


def _variables() -> list:
    out: list = [
        datasource_variable(
            "Prometheus where the nodes' fleet sums meet (deploy/rules/fleet.yml): the global "
            "server, or a node's own for its per-rank row."
        )
    ]
    model = 'engine=~"$engine", model_name=~"$model_name"'
    node = f'{model}, cluster=~"$cluster", instance=~"$instance"'
    for name, label, series in (
        ("engine", "Engine", NODE_SERIES),
        ("model_name", "Model", f'{NODE_SERIES}{{engine=~"$engine"}}'),
        ("cluster", "Cluster", f"{NODE_SERIES}{{{model}}}"),
        ("instance", "Node", f'{NODE_SERIES}{{{model}, cluster=~"$cluster"}}'),
        ("workload", "Workload", f"{NODE_SERIES}{{{node}}}"),
        ("mode", "Mode", f"{NODE_SERIES}{{{node}}}"),
        ("rank", "Rank", f"dspark_request_steps_total{{{node}}}"),
    ):
        out.append(query_variable(name, label, series))
    return out


def build() -> dm.Dashboard:
    return assemble(
        TITLE,
        FLEET_UID,
        "DSpark across clusters, nodes and ranks: throughput, acceptance, utilisation, "
        "ceilings and calibration, each computed from summed counters (never an average "
        "of per-process ratios).",
        ["dspark", "sglang", "speculative-decoding", "fleet"],
        _variables(),
        ROWS,
    )


def generate() -> dict[str, Any]:
    """The fleet dashboard as Grafana's JSON model (a plain dict, stable from run to run)."""
    return to_dict(build())


def render_json() -> str:
    return to_json(generate())
