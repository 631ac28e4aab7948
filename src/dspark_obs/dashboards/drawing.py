"""Render the Grafana dashboard to PNGs and an offline HTML page, without Grafana.

Every data panel of `generate()` has its template variables substituted (`substitute`), its
queries run through Prometheus' `/api/v1/query_range`, and is drawn with matplotlib (Agg):
timeseries as lines, stat and bar-gauge panels as bars of the last values, heatmaps as an
image. `render(...)` writes DIR/NN-<slug>.png per panel, DIR/overview.png (all panels in a
grid) and DIR/index.html (the PNGs embedded as base64, so it opens offline).
"""

from __future__ import annotations

import html
import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..plotting import img_tag, new_figure, save_png

# Grafana's built-in interval variables and the dashboard's query variables ("All" is `.*`).
QUERY_VARIABLES = ("instance", "workload", "mode", "rank")
DEFAULT_VARIABLES: dict[str, str] = {name: ".*" for name in QUERY_VARIABLES}
RATE_INTERVAL = "1m"

_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class RenderError(Exception):
    """Prometheus could not be reached or refused a query; the message is one line."""


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration such as `15s`, `15m`, `1h30m`."""
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += int(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    if not text or pos != len(text) or total <= 0:
        raise ValueError(f"not a duration: {text!r} (e.g. 15s, 15m, 1h)")
    return total


def substitutions(
    variables: Mapping[str, str] | None = None, *, step: str = "15s", range_: str = "5m"
) -> dict[str, str]:
    """Values for every variable the dashboard's queries use ($datasource is not in them)."""
    values = {**DEFAULT_VARIABLES, **(variables or {})}
    # the query variables sit inside "..." PromQL strings
    values = {k: v.replace("\\", "\\\\").replace('"', '\\"') for k, v in values.items()}
    return {
        **values,
        "__rate_interval": RATE_INTERVAL,
        "__interval": step,
        "__range": range_,
    }


def substitute(expr: str, values: Mapping[str, str] | None = None) -> str:
    """Replace `$name` and `${name}` in a panel query; unknown names are left as they are."""
    values = substitutions() if values is None else values

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        return values.get(name, m.group(0))

    return _VAR.sub(repl, expr)


def data_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every panel that is not a row, in dashboard order (collapsed rows nest theirs)."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return [p for p in out if p.get("type") != "row"]


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "panel"


# -- Prometheus ----------------------------------------------------------------------------


class Prometheus:
    def __init__(self, url: str, timeout: float = 10.0) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise RenderError(f"--prometheus must be an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        handlers: list[urllib.request.BaseHandler] = []
        if parsed.hostname in ("localhost", "127.0.0.1", "::1"):
            handlers.append(urllib.request.ProxyHandler({}))  # never send loopback via a proxy
        self._opener = urllib.request.build_opener(*handlers)

    def _api(self, path: str, params: Mapping[str, str]) -> Any:
        url = f"{self.url}{path}"
        data = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(
            url, data=data, headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
        try:
            with self._opener.open(req, timeout=self.timeout) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            raw = exc.read().decode("utf-8", "replace")
            try:
                body = json.loads(raw)
            except ValueError:
                raise RenderError(
                    f"Prometheus at {self.url} answered HTTP {exc.code} for {path}"
                ) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise RenderError(f"cannot reach Prometheus at {self.url}: {reason}") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            detail = body.get("error", body) if isinstance(body, dict) else body
            detail = " ".join(str(detail).split())
            raise RenderError(f"Prometheus at {self.url} refused {path}: {detail}")
        return body["data"]

    def check(self) -> None:
        self._api("/api/v1/query", {"query": "1"})

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        data = self._api(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        if data.get("resultType") != "matrix":
            return []
        return data["result"]


# -- data ----------------------------------------------------------------------------------


@dataclass
class Series:
    label: str
    times: list[float]
    values: list[float]
    le: float | None = None  # heatmap-format bucket bound

    @property
    def last(self) -> float | None:
        for v in reversed(self.values):
            if not math.isnan(v):
                return v
        return None


@dataclass
class PanelData:
    panel: dict[str, Any]
    series: list[Series] = field(default_factory=list)
    exprs: list[str] = field(default_factory=list)
    span: tuple[float, float] | None = None  # query start and end (unix seconds)

    @property
    def has_data(self) -> bool:
        return any(s.last is not None for s in self.series)


_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")
HIDDEN_LABELS = {"__name__", "job", "instance"}
MAX_LABEL = 40


def series_label(metric: Mapping[str, str], legend: str | None) -> str:
    if legend and legend != "__auto":
        text = _LEGEND.sub(lambda m: metric.get(m.group(1), ""), legend)
    else:
        shown = {k: v for k, v in metric.items() if k not in HIDDEN_LABELS}
        text = ",".join(f"{k}={v}" for k, v in sorted(shown.items())) or metric.get(
            "__name__", "value"
        )
    text = " ".join(text.split())
    return text if len(text) <= MAX_LABEL else text[: MAX_LABEL - 1] + "…"


def _float(v: str) -> float:
    try:
        return float(v)
    except ValueError:
        return math.nan


def _le(metric: Mapping[str, str]) -> float | None:
    le = metric.get("le")
    if le is None:
        return None
    return math.inf if le == "+Inf" else _float(le)


def fetch(
    prom: Prometheus, panel: dict[str, Any], values: Mapping[str, str], span: tuple
) -> PanelData:
    start, end, step = span
    data = PanelData(panel, span=(start, end))
    for target in panel.get("targets") or []:
        expr = substitute(target.get("expr", ""), values)
        if not expr.strip():
            continue
        data.exprs.append(expr)
        series = []
        for r in prom.query_range(expr, start, end, step):
            metric = r.get("metric", {})
            points = r.get("values", [])
            series.append(
                Series(
                    label=series_label(metric, target.get("legendFormat")),
                    times=[float(t) for t, _ in points],
                    values=[_float(v) for _, v in points],
                    le=_le(metric),
                )
            )
        if target.get("format") == "heatmap":
            series = _decumulate(series)
        data.series.extend(series)
    return data


def _decumulate(series: list[Series]) -> list[Series]:
    """Cumulative `le` buckets to counts per bucket, as Grafana's heatmap format does."""
    buckets = sorted((s for s in series if s.le is not None), key=lambda s: s.le)
    if not buckets:
        return series
    grid = sorted({t for s in buckets for t in s.times})
    out, below = [], {t: 0.0 for t in grid}
    for s in buckets:
        at = dict(zip(s.times, s.values, strict=True))
        vals = [at.get(t, math.nan) - below[t] for t in grid]
        below = {t: at.get(t, below[t]) for t in grid}
        out.append(Series(s.label, grid, vals, s.le))
    return out


# -- drawing -------------------------------------------------------------------------------

UNITS = {
    "percentunit": ("%", 100.0),
    "s": ("seconds", 1.0),
    "ops": ("ops/s", 1.0),
    "short": ("count", 1.0),
    "none": ("value", 1.0),
}


def unit_of(panel: Mapping[str, Any]) -> tuple[str, float]:
    unit = (panel.get("fieldConfig") or {}).get("defaults", {}).get("unit") or "none"
    if unit.startswith("suffix:"):
        return unit.split(":", 1)[1].strip(), 1.0
    return UNITS.get(unit, (unit, 1.0))


def _no_data(ax, data: PanelData) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_facecolor("#f4f4f4")
    ax.text(
        0.5,
        0.5,
        "no data\n(the queries returned no series)",
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize=11,
        color="#b00020",
    )


def draw_panel(ax, data: PanelData, *, compact: bool = False) -> None:
    """Draw one panel into a matplotlib Axes."""
    panel = data.panel
    unit, scale = unit_of(panel)
    ax.set_title(panel.get("title", ""), fontsize=10 if compact else 12, fontweight="bold")
    if not data.has_data:
        _no_data(ax, data)
        return
    kind = panel.get("type")
    defaults = (panel.get("fieldConfig") or {}).get("defaults", {})
    if kind == "heatmap":
        _heatmap(ax, data, unit, compact)
    elif kind in ("stat", "bargauge"):
        _bars(ax, data, unit, scale, compact)
        if defaults.get("min") is not None and defaults.get("max") is not None:
            ax.set_ylim(defaults["min"] * scale, defaults["max"] * scale)
    else:
        _lines(ax, data, unit, scale, compact)
        lo, hi = defaults.get("min"), defaults.get("max")
        if lo is not None or hi is not None:
            ax.set_ylim(
                bottom=None if lo is None else lo * scale, top=None if hi is None else hi * scale
            )


def _times(ts: list[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t) for t in ts]


def _time_axis(ax, compact: bool) -> None:
    from matplotlib import dates

    locator = dates.AutoDateLocator(maxticks=5 if compact else 7)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator))
    ax.set_xlabel("time", fontsize=8 if compact else 10)


def _lines(ax, data: PanelData, unit: str, scale: float, compact: bool) -> None:
    shown = [s for s in data.series if s.last is not None]
    from matplotlib import dates

    for s in shown:
        xs = dates.date2num(_times(s.times))
        # markers keep a series of one or two points (a fresh Prometheus) visible
        marker = "o" if len(s.times) < 20 else None
        ys = [v * scale for v in s.values]
        ax.plot(xs, ys, label=s.label, linewidth=1.4, marker=marker, markersize=3)
    ax.xaxis_date()
    first = min(min(s.times) for s in shown)
    last = max(max(s.times) for s in shown)
    if data.span:  # the whole queried range, as Grafana shows it
        first, last = min(first, data.span[0]), max(last, data.span[1])
    if last > first:
        ax.set_xlim(dates.date2num(_times([first, last])))
    _time_axis(ax, compact)
    ax.set_ylabel(unit, fontsize=8 if compact else 10)
    ax.grid(True, alpha=0.3)
    limit = 8 if compact else 16
    handles, labels = ax.get_legend_handles_labels()
    if len(handles) > limit:
        labels = labels[:limit]
        handles = handles[:limit]
        labels[-1] = f"… {len(shown) - limit + 1} more"
    ax.legend(
        handles,
        labels,
        fontsize=6 if compact else 8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18 if compact else -0.15),
        ncol=_legend_columns(ax, labels, 6 if compact else 8),
        frameon=False,
    )


def _legend_columns(ax, labels: list[str], fontsize: float) -> int:
    """As many columns as fit the axes' width, so a long legend never squeezes the plot away."""
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72
    entry_pt = max(len(label) for label in labels) * fontsize * 0.6 + 3 * fontsize
    return max(1, min(len(labels), 4, int(width_pt // entry_pt)))


def _bars(ax, data: PanelData, unit: str, scale: float, compact: bool) -> None:
    shown = [s for s in data.series if s.last is not None]
    labels = [s.label or "value" for s in shown]
    values = [s.last * scale for s in shown]
    bars = ax.bar(range(len(values)), values, color="#3274d9")
    ax.set_xticks(range(len(values)))
    rotate = len(values) > 4 or max(len(label) for label in labels) > 12
    ax.set_xticklabels(
        labels, rotation=45 if rotate else 0, ha="right" if rotate else "center", fontsize=7
    )
    ax.set_ylabel(f"{unit} (last value)", fontsize=8 if compact else 10)
    ax.grid(True, axis="y", alpha=0.3)
    if len(values) <= 16:
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], fontsize=7)


def _heatmap(ax, data: PanelData, unit: str, compact: bool) -> None:
    from matplotlib import dates

    rows = [s for s in data.series if s.last is not None]
    if all(s.le is not None for s in rows):
        rows.sort(key=lambda s: s.le)
    grid = sorted({t for s in rows for t in s.times})
    matrix = []
    for s in rows:
        at = dict(zip(s.times, s.values, strict=True))
        matrix.append([at.get(t, math.nan) for t in grid])
    cmap = (data.panel.get("options") or {}).get("color", {}).get("scheme", "Oranges") or "Oranges"
    x0 = dates.date2num(datetime.fromtimestamp(grid[0]))
    x1 = dates.date2num(datetime.fromtimestamp(grid[-1])) if len(grid) > 1 else x0 + 1e-3
    image = ax.imshow(
        matrix,
        aspect="auto",
        origin="lower",
        interpolation="nearest",
        cmap=cmap,
        extent=(x0, x1, -0.5, len(rows) - 0.5),
    )
    ax.xaxis_date()
    _time_axis(ax, compact)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([s.label for s in rows], fontsize=7)
    ax.set_ylabel(f"{unit} (bucket le)", fontsize=8 if compact else 10)
    bar = ax.figure.colorbar(image, ax=ax)
    bar.ax.tick_params(labelsize=7)
    bar.set_label("per second", fontsize=8)


def panel_png(data: PanelData, path: Path) -> None:
    grid = data.panel.get("gridPos") or {}
    width = max(5.0, min(14.0, grid.get("w", 12) * 0.6))
    height = 4.5 if data.panel.get("type") == "timeseries" else 4.0
    fig = new_figure(width, height)
    draw_panel(fig.add_subplot(), data)
    save_png(fig, path)


def overview_png(datas: list[PanelData], path: Path, title: str, cols: int = 4) -> None:
    rows = math.ceil(len(datas) / cols)
    fig = new_figure(cols * 5.5, rows * 4.2)
    fig.suptitle(title, fontsize=16, fontweight="bold")
    for i, data in enumerate(datas):
        draw_panel(fig.add_subplot(rows, cols, i + 1), data, compact=True)
    save_png(fig, path, dpi=70)


def index_html(
    title: str, subtitle: str, overview: Path, panels: list[tuple[PanelData, Path]]
) -> str:
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:1em 2em;background:#fafafa}"
        "figure{display:inline-block;vertical-align:top;margin:0.5em;background:#fff;"
        "padding:0.5em;border:1px solid #ddd;max-width:46%}img{max-width:100%}"
        "figcaption{font-size:0.85em;color:#444}code{font-size:0.8em;word-break:break-all}"
        "details{margin-top:0.3em}.nodata{color:#b00020}</style>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(subtitle)}</p>",
        "<h2>Overview</h2>",
        img_tag(overview, "overview"),
        "<h2>Panels</h2>",
    ]
    for data, path in panels:
        p = data.panel
        note = "" if data.has_data else ' <span class="nodata">(no data)</span>'
        queries = "".join(f"<li><code>{html.escape(e)}</code></li>" for e in data.exprs)
        parts.append(
            f'<figure id="{html.escape(path.stem)}">{img_tag(path, p.get("title", ""))}'
            f"<figcaption><b>{html.escape(p.get('title', ''))}</b>{note} "
            f"({html.escape(path.name)})<br>{html.escape(p.get('description', ''))}"
            f"<details><summary>queries</summary><ul>{queries}</ul></details>"
            "</figcaption></figure>"
        )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


@dataclass
class Rendered:
    panels: list[tuple[PanelData, Path]]
    overview: Path
    index: Path


def render(
    prometheus_url: str,
    out: str | Path,
    *,
    range_: str = "15m",
    step: str = "15s",
    variables: Mapping[str, str] | None = None,
    timeout: float = 10.0,
    dashboard: Mapping[str, Any] | None = None,
    end: float | None = None,
) -> Rendered:
    """Query every panel over the last `range_` and write the PNGs, overview and index.html."""
    if dashboard is None:
        from .definition import generate

        dashboard = generate()
    span_s, step_s = parse_duration(range_), parse_duration(step)
    prom = Prometheus(prometheus_url, timeout=timeout)
    prom.check()
    end = time.time() if end is None else end
    span = (end - span_s, end, step_s)
    values = substitutions(variables, step=step, range_=range_)
    datas = [fetch(prom, p, values, span) for p in data_panels(dashboard)]

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for i, data in enumerate(datas, start=1):
        path = root / f"{i:02d}-{slug(data.panel.get('title', ''))}.png"
        panel_png(data, path)
        written.append((data, path))
    title = dashboard.get("title", "dashboard")
    when = datetime.fromtimestamp(end).strftime("%Y-%m-%d %H:%M:%S")
    chosen = ", ".join(f"{k}={v}" for k, v in {**DEFAULT_VARIABLES, **(variables or {})}.items())
    subtitle = f"{prom.url}, last {range_} to {when}, step {step}; {chosen}"
    overview = root / "overview.png"
    overview_png(datas, overview, f"{title} — last {range_}")
    index = root / "index.html"
    index.write_text(index_html(title, subtitle, overview, written), encoding="utf-8")
    return Rendered(written, overview, index)
