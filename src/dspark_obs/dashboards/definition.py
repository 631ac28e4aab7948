"""The main dashboard, "DSpark — acceptance and ceiling", built with grafana-foundation-sdk.

Every query filters on the template variables (`$instance`, `$workload`, `$mode`, `$rank`,
all multi-value with `.*` as "All") by regex, so the same PromQL runs in Grafana and, with the
variables replaced by `.*`, straight against Prometheus (which is how the tests check it).
Metric names and labels are those of `exporters/catalog.py` (docs/metrics.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, common, dashboard, heatmap, prometheus, stat
from grafana_foundation_sdk.builders import timeseries as ts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

from ..aggregates.confidence import ECE_BINS

DASHBOARD_UID = "dspark-acceptance"
TITLE = "DSpark — acceptance and ceiling"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")

# label selectors per label set of the catalog
REQ = 'instance=~"$instance", workload=~"$workload", mode=~"$mode", rank=~"$rank"'
STEP = 'instance=~"$instance", mode=~"$mode", rank=~"$rank"'
REL = 'instance=~"$instance", workload=~"$workload", mode=~"$mode"'
SRC = 'instance=~"$instance"'
RI = "[$__rate_interval]"

GREEN, YELLOW, RED, BLUE = "green", "yellow", "red", "blue"


def _thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(dm.ThresholdsMode.ABSOLUTE)
        .steps([dm.Threshold(value=v, color=c) for v, c in steps])
    )


NEUTRAL = _thresholds((None, GREEN))
UTILISATION = _thresholds((None, RED), (0.8, YELLOW), (0.95, GREEN))
ECE = _thresholds((None, GREEN), (0.05, YELLOW), (0.1, RED))
BRIER = _thresholds((None, GREEN), (0.15, YELLOW), (0.25, RED))
AUROC = _thresholds((None, RED), (0.6, YELLOW), (0.75, GREEN))
R2 = _thresholds((None, RED), (0.5, YELLOW), (0.9, GREEN))
REL_ERROR = _thresholds((None, GREEN), (0.1, YELLOW), (0.25, RED))
UP = _thresholds((None, RED), (1, GREEN))
ANY_BAD = _thresholds((None, GREEN), (1e-9, RED))


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


def _mean(hist: str, sel: str, by: str = "") -> str:
    """Mean of a histogram over the rate window: rate(sum) / rate(count)."""
    agg = f"sum by ({by})" if by else "sum"
    return f"{agg} (rate({hist}_sum{{{sel}}}{RI})) / {agg} (rate({hist}_count{{{sel}}}{RI}))"


# -- rows ----------------------------------------------------------------------------------


def overview() -> list:
    return [
        stat_panel(
            "Committed tokens/s",
            "Tokens committed per second of wall time (accepted drafts plus the bonus token, "
            "SGLang acc_len), summed over the selected workloads, modes and ranks.",
            "suffix: tok/s",
            [(f"sum(rate(dspark_committed_tokens_sum{{{REQ}}}{RI}))", "committed")],
            decimals=0,
        ),
        stat_panel(
            "Mean accepted",
            "Drafts the target accepted per request-step (correct_drafts), over the rate window.",
            "suffix: tok",
            [(_mean("dspark_accepted_tokens", REQ), "accepted")],
        ),
        stat_panel(
            "Mean window",
            "Drafts verified per request-step (verify_len - 1), over the rate window. Below "
            "gamma means the scheduler trimmed blocks.",
            "suffix: tok",
            [(_mean("dspark_window_tokens", REQ), "window")],
        ),
        stat_panel(
            "Utilisation",
            "Accepted / ceiling over request-steps whose ceiling is known (static, cap-accept, "
            "shadow twin): 1 - trim loss / ceiling over the rate window. 1 means trimming lost "
            "nothing.",
            "percentunit",
            [
                (
                    f"1 - sum(rate(dspark_trim_loss_tokens_total{{{REQ}}}{RI})) / "
                    f"sum(rate(dspark_ceiling_tokens_sum{{{REQ}}}{RI}))",
                    "utilisation",
                )
            ],
            thresholds=UTILISATION,
        ),
        stat_panel(
            "Trim loss per request-step",
            "Tokens full-block verification would have accepted beyond the window "
            "(ceiling - accepted), per request-step, on request-steps whose ceiling is known.",
            "suffix: tok",
            [
                (
                    f"sum(rate(dspark_trim_loss_tokens_total{{{REQ}}}{RI})) / "
                    f"sum(rate(dspark_ceiling_tokens_count{{{REQ}}}{RI}))",
                    "trim loss",
                )
            ],
            thresholds=_thresholds((None, GREEN), (0.1, YELLOW), (0.5, RED)),
            decimals=3,
        ),
        stat_panel(
            "Trimmed drafts per request-step",
            "Drafted tokens left unverified by trimming (gamma - window) per request-step.",
            "suffix: tok",
            [
                (
                    f"sum(rate(dspark_trimmed_draft_tokens_total{{{REQ}}}{RI})) / "
                    f"sum(rate(dspark_request_steps_total{{{REQ}}}{RI}))",
                    "trimmed",
                )
            ],
        ),
        timeseries(
            "Accepted, window and ceiling",
            "Mean drafts per request-step: window (verified), accepted, the ceiling full-block "
            "verification would accept (histogram by source: observed from static/cap-accept "
            "rows, shadow from a cap-accept twin; and the sliding gauge "
            "dspark_ceiling_mean_tokens), and the estimated ceiling (source=walk: observed plus "
            "tail walks; source=population: survival curve). Gauges are averaged unweighted "
            "over the selected series.",
            "suffix: tok",
            [
                (_mean("dspark_window_tokens", REQ), "window"),
                (_mean("dspark_accepted_tokens", REQ), "accepted"),
                (_mean("dspark_ceiling_tokens", REQ, "source"), "ceiling ({{source}})"),
                (f"avg(dspark_ceiling_mean_tokens{{{REQ}}})", "ceiling (last N steps)"),
                (
                    f"avg by (source) (dspark_ceiling_estimate_tokens{{{REQ}}})",
                    "estimated ceiling ({{source}})",
                ),
            ],
            w=16,
            min_val=0,
        ),
        timeseries(
            "Utilisation (last N steps)",
            "dspark_utilisation_ratio: accepted / ceiling over the last N steps per workload, "
            "mode and rank; 1 means trimming lost nothing.",
            "percentunit",
            [(f"dspark_utilisation_ratio{{{REQ}}}", "{{workload}} {{mode}} r{{rank}}")],
            thresholds=UTILISATION,
            w=8,
            max_val=1,
        ),
    ]


def per_workload() -> list:
    window_dist = [
        (
            f"sum by (le) (increase(dspark_window_tokens_bucket{{{REQ}}}[$__range]))",
            "{{le}}",
        )
    ]
    return [
        timeseries(
            "Window vs ceiling by workload",
            "Mean verified window and mean ceiling (observed or shadow; else the walk estimate) "
            "per request-step, by workload. The gap between the two lines is what trimming "
            "saves in verify tokens; the gap between accepted and ceiling is what it costs.",
            "suffix: tok",
            [
                (_mean("dspark_window_tokens", REQ, "workload"), "window {{workload}}"),
                (_mean("dspark_accepted_tokens", REQ, "workload"), "accepted {{workload}}"),
                (_mean("dspark_ceiling_tokens", REQ, "workload"), "ceiling {{workload}}"),
                (
                    f'avg by (workload) (dspark_ceiling_estimate_tokens{{{REQ}, source="walk"}})',
                    "estimated ceiling {{workload}}",
                ),
            ],
            w=12,
            min_val=0,
        ),
        bar_gauge(
            "Verify-length distribution",
            "Request-steps by drafts verified (window, 0..gamma) over the dashboard's time "
            "range, from dspark_window_tokens_bucket (cumulative buckets turned into counts "
            "per length by the heatmap format).",
            "short",
            window_dist,
            fmt="heatmap",
            w=6,
        ),
        timeseries(
            "Utilisation by workload",
            "Accepted / ceiling over the rate window by workload: 1 - trim loss / ceiling.",
            "percentunit",
            [
                (
                    f"1 - sum by (workload) (rate(dspark_trim_loss_tokens_total{{{REQ}}}{RI})) / "
                    f"sum by (workload) (rate(dspark_ceiling_tokens_sum{{{REQ}}}{RI}))",
                    "{{workload}}",
                )
            ],
            thresholds=UTILISATION,
            w=6,
            max_val=1,
        ),
    ]


def load() -> list:
    return [
        timeseries(
            "Budget and verify tokens per step",
            "Per verify step: the scheduler budget K (extra verify tokens beyond one anchor per "
            "request; compact and cap-accept only), the verify tokens after rounding up to the "
            "graph tier, and the batch size, from the step histograms.",
            "short",
            [
                (_mean("dspark_budget_tokens", STEP), "budget K"),
                (_mean("dspark_verify_tokens", STEP), "verify tokens"),
                (_mean("dspark_graph_tier_tokens", STEP), "graph tier"),
                (_mean("dspark_batch_size", STEP), "batch size"),
            ],
            w=8,
            min_val=0,
        ),
        timeseries(
            "Tokens per request vs batch size",
            "Budget and verify tokens per request (÷ mean batch size): as the batch grows the "
            "scheduler gives each request a smaller window.",
            "short",
            [
                (
                    f"sum(rate(dspark_budget_tokens_sum{{{STEP}}}{RI})) / "
                    f"sum(rate(dspark_batch_size_sum{{{STEP}}}{RI}))",
                    "budget per request",
                ),
                (
                    f"sum(rate(dspark_verify_tokens_sum{{{STEP}}}{RI})) / "
                    f"sum(rate(dspark_batch_size_sum{{{STEP}}}{RI}))",
                    "verify tokens per request",
                ),
            ],
            w=8,
            min_val=0,
        ),
        heatmap_panel(
            "Batch size distribution",
            "Verify steps by requests per step (power-of-two buckets) over time.",
            "short",
            f"sum by (le) (rate(dspark_batch_size_bucket{{{STEP}}}{RI}))",
            w=8,
        ),
    ]


def _reliability_queries() -> list[tuple[str, str]]:
    """Observed acceptance per predicted-survival bin: bucket differences of the two histograms.

    The buckets are cumulative, so bin k is bucket(le=hi) - bucket(le=lo); the bounds are
    formatted exactly as the exporter writes them.
    """
    bounds = [f"{(k + 1) / ECE_BINS:.6g}" for k in range(ECE_BINS - 1)] + ["+Inf"]
    out = []
    for k, hi in enumerate(bounds):
        lo = bounds[k - 1] if k else None

        def bucket(name: str, le: str) -> str:
            return f'sum({name}{{{REL}, le="{le}"}})'

        num = bucket("dspark_confidence_accepted_survival_bucket", hi)
        den = bucket("dspark_confidence_survival_bucket", hi)
        if lo is not None:
            num = f"({num} - {bucket('dspark_confidence_accepted_survival_bucket', lo)})"
            den = f"({den} - {bucket('dspark_confidence_survival_bucket', lo)})"
        out.append((f"{num} / {den}", f"{k / ECE_BINS:.2f}-{(k + 1) / ECE_BINS:.2f}"))
    return out


def calibration() -> list:
    by_pos = "{{position}}"
    return [
        timeseries(
            "ECE by position",
            "Expected calibration error of predicted survival at each draft position over the "
            "last N steps (15 equal-width bins), averaged over the selected series.",
            "percentunit",
            [(f"avg by (position) (dspark_confidence_ece{{{REQ}}})", "position " + by_pos)],
            thresholds=ECE,
            w=8,
            min_val=0,
        ),
        timeseries(
            "Brier score by position",
            "Brier score of predicted survival against the prefix label, by position.",
            "none",
            [(f"avg by (position) (dspark_confidence_brier{{{REQ}}})", "position " + by_pos)],
            thresholds=BRIER,
            w=8,
            min_val=0,
        ),
        timeseries(
            "AUROC by position",
            "How well predicted survival ranks accepted above rejected prefixes, by position; "
            "0.5 is chance.",
            "none",
            [(f"avg by (position) (dspark_confidence_auroc{{{REQ}}})", "position " + by_pos)],
            thresholds=AUROC,
            w=8,
            min_val=0,
            max_val=1,
        ),
        bar_gauge(
            "Reliability by bin",
            "Observed share of accepted prefixes per predicted-survival bin since start, all "
            "positions: (accepted_survival bucket difference) / (survival bucket difference). "
            "A calibrated predictor reads close to the bin's centre.",
            "percentunit",
            _reliability_queries(),
            thresholds=_thresholds((None, BLUE)),
            w=24,
            max_val=1,
        ),
    ]


def cost_model() -> list:
    return [
        timeseries(
            "Predicted vs measured step time",
            "Mean step time of the cost table's prediction T(bs, K) and of the measurement "
            "(step_gpu_ms, else step_cpu_ms), over steps that have both.",
            "s",
            [
                (
                    f"sum by (mode, rank) (rate(dspark_step_predicted_seconds_total{{{STEP}}}{RI}))"
                    f" / sum by (mode, rank) (rate(dspark_cost_model_steps_total{{{STEP}}}{RI}))",
                    "predicted {{mode}} r{{rank}}",
                ),
                (
                    f"sum by (mode, rank) (rate(dspark_step_measured_seconds_total{{{STEP}}}{RI}))"
                    f" / sum by (mode, rank) (rate(dspark_cost_model_steps_total{{{STEP}}}{RI}))",
                    "measured {{mode}} r{{rank}}",
                ),
            ],
            w=10,
            min_val=0,
        ),
        timeseries(
            "Relative error and bias",
            "Median |measured - predicted| / measured over the last N steps (15% resolution), "
            "and the mean absolute error relative to the mean measured step time.",
            "percentunit",
            [
                (
                    f"dspark_cost_model_relative_error_ratio{{{STEP}}}",
                    "median relative error {{mode}} r{{rank}}",
                ),
                (
                    f"dspark_cost_model_abs_error_seconds{{{STEP}}} / "
                    f"dspark_step_measured_seconds{{{STEP}}}",
                    "mean abs error / mean measured {{mode}} r{{rank}}",
                ),
            ],
            thresholds=REL_ERROR,
            w=10,
            min_val=0,
        ),
        stat_panel(
            "Refit R²",
            "R² of the additive table T = bias + alpha(bs) + theta(M) refitted online to the "
            "measured step times since start; low means the table's shape does not fit.",
            "none",
            [(f"min(dspark_cost_model_refit_r2{{{STEP}}})", "R²")],
            thresholds=R2,
            w=4,
            h=8,
            decimals=3,
        ),
    ]


def estimator() -> list:
    return [
        timeseries(
            "Ceiling walks",
            "Per second: trimmed request-steps whose tail is walked, walks resolved (greedy "
            "exact, sampled with an interval), censored (request ended first: lower bounds), "
            "and skipped (no walk possible: population estimate only).",
            "ops",
            [
                (f"sum(rate(dspark_estimator_trimmed_blocks_total{{{REQ}}}{RI}))", "trimmed"),
                (
                    f"sum by (source) (rate(dspark_estimator_resolved_blocks_total{{{REQ}}}{RI}))",
                    "resolved {{source}}",
                ),
                (
                    f"sum by (source) (rate(dspark_estimator_censored_blocks_total{{{REQ}}}{RI}))",
                    "censored {{source}}",
                ),
                (f"sum(rate(dspark_estimator_skipped_blocks_total{{{REQ}}}{RI}))", "skipped"),
            ],
            w=10,
            min_val=0,
        ),
        timeseries(
            "Pending walks",
            "Walks open now (their request has not mismatched or ended yet).",
            "short",
            [(f"sum(dspark_estimator_pending_blocks{{{REQ}}})", "pending")],
            w=6,
            min_val=0,
        ),
        timeseries(
            "Ceiling estimate interval width",
            "Upper - lower bound of the walk estimate of the mean ceiling over the last N steps; "
            "wide means sampled walks leave the ceiling uncertain.",
            "suffix: tok",
            [
                (
                    f"dspark_ceiling_estimate_upper_tokens{{{REQ}}} - "
                    f"dspark_ceiling_estimate_lower_tokens{{{REQ}}}",
                    "{{workload}} {{mode}} r{{rank}}",
                )
            ],
            thresholds=_thresholds((None, GREEN), (0.25, YELLOW), (1, RED)),
            w=8,
            min_val=0,
        ),
    ]


def sources() -> list:
    zero_per_source = f"sum by (source) (dspark_source_up{{{SRC}}}) * 0"
    return [
        stat_panel(
            "Sources up",
            "1 while a source delivers step records, 0 while it fails.",
            "none",
            [(f"min by (source) (dspark_source_up{{{SRC}}})", "{{source}}")],
            thresholds=UP,
            w=4,
            h=8,
            decimals=0,
        ),
        timeseries(
            "Records/s",
            "Step records accepted per second, by source.",
            "ops",
            [
                (
                    f"sum by (source) (rate(dspark_ingest_records_total{{{SRC}}}{RI}))",
                    "{{source}}",
                )
            ],
            w=7,
            min_val=0,
        ),
        timeseries(
            "Ingest errors by reason",
            "Step records rejected per second, by source and reason (dropped steps are shown "
            "on their own); 0 per source while there are none.",
            "ops",
            [
                (
                    "sum by (source, reason) (rate(dspark_ingest_errors_total"
                    f'{{{SRC}, reason!="dropped_steps"}}{RI})) or on (source) {zero_per_source}',
                    "{{source}} {{reason}}",
                )
            ],
            thresholds=ANY_BAD,
            w=7,
            min_val=0,
        ),
        stat_panel(
            "Dropped steps",
            "Verify steps missing from a polled server's dumps over the dashboard's time range "
            "(gaps in forward_ct; with draining, steps recorded between a read and the clear).",
            "short",
            [
                (
                    "sum by (source) (increase(dspark_ingest_errors_total"
                    f'{{{SRC}, reason="dropped_steps"}}[$__range])) or on (source) '
                    f"{zero_per_source}",
                    "{{source}}",
                )
            ],
            thresholds=ANY_BAD,
            w=3,
            h=8,
            decimals=0,
        ),
        stat_panel(
            "Workload overflow/s",
            'Request-steps per second counted under workload="other" because the workload '
            "cap (--workload-cap) was reached.",
            "ops",
            [(f"sum(rate(dspark_workload_overflow_total{{{SRC}}}{RI}))", "overflow")],
            thresholds=ANY_BAD,
            w=3,
            h=8,
        ),
    ]


ROWS = (
    ("Overview", overview),
    ("Per workload", per_workload),
    ("Load", load),
    ("Calibration", calibration),
    ("Cost model", cost_model),
    ("Estimator health", estimator),
    ("Sources", sources),
)


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


DASHBOARDS_YML = """\
# Grafana file provisioning: copy to /etc/grafana/provisioning/dashboards/ and put
# dspark.json in the folder named by `path`.
apiVersion: 1
providers:
  - name: dspark
    orgId: 1
    folder: DSpark
    type: file
    disableDeletion: false
    allowUiUpdates: false
    updateIntervalSeconds: 60
    options:
      path: /var/lib/grafana/dashboards/dspark
      foldersFromFilesStructure: false
"""

DATASOURCES_YML = """\
# Grafana file provisioning: copy to /etc/grafana/provisioning/datasources/ and point `url`
# at the Prometheus that scrapes `dspark-obs serve`. The dashboard's "Data source" variable
# lists every Prometheus data source; this one is the default.
apiVersion: 1
datasources:
  - name: Prometheus
    type: prometheus
    uid: prometheus
    access: proxy
    url: http://localhost:9090
    isDefault: true
    jsonData:
      timeInterval: 15s
"""


def write_tree(directory: str | Path) -> list[Path]:
    """Write DIR/dspark.json and DIR/provisioning/{dashboards,datasources}.yml."""
    root = Path(directory)
    (root / "provisioning").mkdir(parents=True, exist_ok=True)
    files = {
        root / "dspark.json": render_json(),
        root / "provisioning" / "dashboards.yml": DASHBOARDS_YML,
        root / "provisioning" / "datasources.yml": DATASOURCES_YML,
    }
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return list(files)
