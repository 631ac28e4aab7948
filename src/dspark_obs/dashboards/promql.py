"""PromQL pieces every row's queries are made of: label selectors and histogram means.

Every selector filters on the template variables by regex (`.*` is "All"), per label set
of the exporter's catalog, so a query written once runs in Grafana and, with the variables
replaced, straight against Prometheus.
"""

from __future__ import annotations

# label selectors per label set of the catalog; every series carries the exporter's engine and
# model (catalog.IDENTITY)
IDENTITY = 'engine=~"$engine", model_name=~"$model_name"'
REQ = f'{IDENTITY}, instance=~"$instance", workload=~"$workload", mode=~"$mode", rank=~"$rank"'
STEP = f'{IDENTITY}, instance=~"$instance", mode=~"$mode", rank=~"$rank"'
REL = f'{IDENTITY}, instance=~"$instance", workload=~"$workload", mode=~"$mode"'
SRC = f'{IDENTITY}, instance=~"$instance"'
RI = "[$__rate_interval]"


def rate_mean(hist: str, sel: str, by: str = "") -> str:
    """Mean of a histogram over the rate window: rate(sum) / rate(count)."""
    agg = f"sum by ({by})" if by else "sum"
    return f"{agg} (rate({hist}_sum{{{sel}}}{RI})) / {agg} (rate({hist}_count{{{sel}}}{RI}))"
