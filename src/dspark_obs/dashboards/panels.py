"""Grafana panels the way this dashboard draws them, built with grafana-foundation-sdk.

The rows say what to show (title, description, unit, queries); this module says how every
panel of a kind looks, and the thresholds that colour good and bad values, so that the
rows stay a list of questions and the look changes in one place.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, common, dashboard, heatmap, prometheus, stat
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

GREEN, YELLOW, RED, BLUE = "green", "yellow", "red", "blue"


def threshold_steps(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


NEUTRAL = threshold_steps((None, GREEN))
UTILISATION = threshold_steps((None, RED), (0.8, YELLOW), (0.95, GREEN))
ECE = threshold_steps((None, GREEN), (0.05, YELLOW), (0.1, RED))
BRIER = threshold_steps((None, GREEN), (0.15, YELLOW), (0.25, RED))
AUROC = threshold_steps((None, RED), (0.6, YELLOW), (0.75, GREEN))
R2 = threshold_steps((None, RED), (0.5, YELLOW), (0.9, GREEN))
REL_ERROR = threshold_steps((None, GREEN), (0.1, YELLOW), (0.25, RED))
UP = threshold_steps((None, RED), (1, GREEN))
ANY_BAD = threshold_steps((None, GREEN), (1e-9, RED))


def _q(expr: str, legend: str, ref: str, *, instant: bool = False, fmt: str | None = None):
    q = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref)
    q = q.instant() if instant else q.range()
    if fmt == "heatmap":
        q = q.format(pm.PromQueryFormat.HEATMAP)
    return q


def _targets(panel, queries: list[tuple[str, str]], **kw):
    for i, (expr, legend) in enumerate(queries):
        panel = panel.with_target(_q(expr, legend, chr(ord("A") + i), **kw))
    return panel


def _common(panel, title: str, description: str, unit: str, thresholds, w: int, h: int):
    return (
        panel.title(title)
        .description(description)
        .datasource(DS)
        .unit(unit)
        .thresholds(thresholds)
        .span(w)
        .height(h)
    )


def timeseries(
    title: str,
    description: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    thresholds=NEUTRAL,
    w: int = 12,
    h: int = 8,
    min_val: float | None = None,
    max_val: float | None = None,
):
    p = _common(ts.Panel(), title, description, unit, thresholds, w, h)
    # Grafana cannot key a colour on one label; by name, a series at least keeps its colour
    # from panel to panel and from one reload to the next, whatever else is shown beside it.
    p = p.color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC_BY_NAME))
    p = p.legend(
        common.VizLegendOptions()
        .display_mode(cm.LegendDisplayMode.LIST)
        .placement(cm.LegendPlacement.BOTTOM)
        .show_legend(True)
    )
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    return _targets(p, queries)


def stat_panel(
    title: str,
    description: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    thresholds=NEUTRAL,
    w: int = 4,
    h: int = 4,
    decimals: float | None = 2,
):
    p = _common(stat.Panel(), title, description, unit, thresholds, w, h)
    p = p.color_mode(cm.BigValueColorMode.VALUE).graph_mode(cm.BigValueGraphMode.AREA)
    p = p.reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    if decimals is not None:
        p = p.decimals(decimals)
    return _targets(p, queries)


def bar_gauge(
    title: str,
    description: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    thresholds=NEUTRAL,
    fmt: str | None = None,
    w: int = 12,
    h: int = 8,
    min_val: float | None = 0,
    max_val: float | None = None,
):
    p = _common(bargauge.Panel(), title, description, unit, thresholds, w, h)
    p = (
        p.display_mode(cm.BarGaugeDisplayMode.GRADIENT)
        .orientation(cm.VizOrientation.VERTICAL)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if min_val is not None:
        p = p.min(min_val)
    if max_val is not None:
        p = p.max(max_val)
    return _targets(p, queries, instant=True, fmt=fmt)


def heatmap_panel(title: str, description: str, unit: str, expr: str, *, w: int = 12, h: int = 8):
    p = _common(heatmap.Panel(), title, description, unit, NEUTRAL, w, h)
    p = p.calculate(False).color(
        heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges").steps(64)
    )
    return p.with_target(_q(expr, "{{le}}", "A", fmt="heatmap"))
