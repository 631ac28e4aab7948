"""Grafana panels the way this dashboard draws them, built with grafana-foundation-sdk.

The rows say what to show (title, description, unit, queries); this module says how every
panel of a kind looks, and the thresholds that colour good and bad values, so that the
rows stay a list of questions and the look changes in one place.

Every panel also says why it can be empty: Grafana's bare "No data" leaves a reader to guess
between a broken scrape and a feature not switched on, so each panel names its reasons
(`empty`), shown in its place (the field's `noValue`) and at the end of its description.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import bargauge, common, dashboard, heatmap, prometheus, stat
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from ..aggregates.confidence import ECE_BINS

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

# Why a panel's queries can come back empty, each as a clause after "No data: " (docs/metrics.md
# says when each family has no series).
#: the main dashboard: nothing scraped, or nothing the variables select in the window
NO_SERIES = "no dspark-obs series match the variables in this range"
NO_CONFIDENCE = "the step records carry no drafter confidence (survival)"
NO_STEP_TIMES = (
    "no step has both a measured step time (step_gpu_ms, step_cpu_ms) and the cost "
    "table's prediction (predicted_step_ms)"
)
NO_REFIT = "no refit yet: it needs measured step times in two (batch size, verify tokens) cells"
NO_PRICED_STEPS = (
    "no step priced yet: static's step time needs a cost table (the runtime's "
    "--cost-table, else the online refit from measured step times)"
)
NO_SGLANG = "SGLang's own /metrics (--enable-metrics) is not scraped beside series of engine sglang"
NO_SOURCE_STATE = "no source reports its state (serve's sources do; the hook consumer does not)"
#: the fleet dashboard: where the node sums it reads are not recorded or federated
NO_NODE_SUMS = (
    "no node sums (instance:dspark_*:sum, fleet.yml's node rules) match the variables here"
)
NO_RANK_COUNTERS = (
    "the exporters' per-rank counters are not here (only a node's own Prometheus holds "
    'them, unless federated whole: {__name__=~"dspark_.*"})'
)


def why_empty(reasons) -> str:
    """The noValue text of a panel that can be empty for `reasons`."""
    return "No data: " + "; or ".join(reasons)


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


def _common(
    panel,
    title: str,
    description: str,
    unit: str,
    *,
    empty: tuple[str, ...],
    thresholds=NEUTRAL,
    w: int = 12,
    h: int = 8,
):
    """The look every panel shares, whatever its kind (each kind's `**look`): `empty`, why
    it can be empty (required), `thresholds`, what colours its values, and its width `w`
    and height `h` in grid units."""
    if not empty:
        raise ValueError(f"{title!r}: say why it can be empty")
    why = why_empty(empty)
    return (
        panel.title(title)
        .description(f"{description} {why}.")
        .datasource(DS)
        .unit(unit)
        .thresholds(thresholds)
        .no_value(why)
        .span(w)
        .height(h)
    )


def _bounds(panel, min_val: float | None, max_val: float | None):
    if min_val is not None:
        panel = panel.min(min_val)
    if max_val is not None:
        panel = panel.max(max_val)
    return panel


def timeseries(
    title: str,
    description: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    min_val: float | None = None,
    max_val: float | None = None,
    **look,
):
    p = _common(ts.Panel(), title, description, unit, **look)
    # Grafana cannot key a colour on one label; by name, a series at least keeps its colour
    # from panel to panel and from one reload to the next, whatever else is shown beside it.
    p = p.color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.PALETTE_CLASSIC_BY_NAME))
    p = p.legend(
        common.VizLegendOptions()
        .display_mode(cm.LegendDisplayMode.LIST)
        .placement(cm.LegendPlacement.BOTTOM)
        .show_legend(True)
    )
    return _targets(_bounds(p, min_val, max_val), queries)


def stat_panel(
    title: str,
    description: str,
    unit: str,
    queries: list[tuple[str, str]],
    *,
    decimals: float | None = 2,
    named: bool = False,
    **look,
):
    """A big number, 4 x 4 unless `look` says otherwise. `named`: the value's series name
    shown under it even when alone, for a value whose name says what it rests on (a known
    or an estimated ceiling)."""
    p = _common(stat.Panel(), title, description, unit, **{"w": 4, "h": 4, **look})
    p = p.color_mode(cm.BigValueColorMode.VALUE).graph_mode(cm.BigValueGraphMode.AREA)
    if named:
        p = p.text_mode(cm.BigValueTextMode.VALUE_AND_NAME)
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
    fmt: str | None = None,
    min_val: float | None = 0,
    max_val: float | None = None,
    **look,
):
    p = _common(bargauge.Panel(), title, description, unit, **look)
    p = (
        p.display_mode(cm.BarGaugeDisplayMode.GRADIENT)
        .orientation(cm.VizOrientation.VERTICAL)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    return _targets(_bounds(p, min_val, max_val), queries, instant=True, fmt=fmt)


def heatmap_panel(title: str, description: str, unit: str, expr: str, **look):
    p = _common(heatmap.Panel(), title, description, unit, **look)
    p = p.calculate(False).color(
        heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme("Oranges").steps(64)
    )
    return p.with_target(_q(expr, "{{le}}", "A", fmt="heatmap"))


#: how each calibration figure is drawn, on either dashboard: its unit, the thresholds that
#: colour it and its top (ECE is a share, Brier a score, AUROC a probability)
CALIBRATION_FIGURES = {
    "ECE": ("percentunit", ECE, None),
    "Brier": ("none", BRIER, None),
    "AUROC": ("none", AUROC, 1),
}


def calibration_timeseries(
    figure: str, title: str, description: str, queries: list[tuple[str, str]], **look
):
    """One calibration figure (a key of CALIBRATION_FIGURES) over time, from 0."""
    unit, thresholds, top = CALIBRATION_FIGURES[figure]
    return timeseries(
        title, description, unit, queries, thresholds=thresholds, min_val=0, max_val=top, **look
    )


def utilisation_timeseries(title: str, description: str, queries: list[tuple[str, str]], **look):
    """Accepted / ceiling over time: a share up to 1, coloured where trimming loses."""
    return timeseries(
        title, description, "percentunit", queries, thresholds=UTILISATION, max_val=1, **look
    )


def reliability_bars(description: str, bin_query, **look):
    """The observed share of accepted prefixes per predicted-survival bin, one bar a bin,
    `bin_query(k)` the query of bin k; a calibrated predictor's bars stand at their bins'
    centres."""
    queries = [
        (bin_query(k), f"{k / ECE_BINS:.2f}-{(k + 1) / ECE_BINS:.2f}") for k in range(ECE_BINS)
    ]
    return bar_gauge(
        "Reliability by bin",
        description,
        "percentunit",
        queries,
        thresholds=threshold_steps((None, BLUE)),
        max_val=1,
        **look,
    )
