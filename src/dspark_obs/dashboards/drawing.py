"""Render the Grafana dashboard to PNGs and an offline HTML page, without Grafana.

Every data panel of the dashboard (the copy of `generate()` shipped in the package) has its
template variables substituted (`substitute`), its queries run through Prometheus'
`/api/v1/query_range`, and is drawn with matplotlib (Agg) as Grafana shows it:
timeseries as lines, stat panels as big numbers in their threshold colours, bar gauges as
bars of the last values, heatmaps as an image. `render(...)` writes DIR/NN-<slug>.png per
panel, DIR/overview.png (all panels in a grid) and DIR/index.html (the PNGs embedded as
base64, so it opens offline).

This module walks the dashboard and lays the drawings out as files and a page; `querying`
fetches each panel's series, `panel_plots` draws them and `values` writes their numbers.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ..durations import parse_duration
from ..outputs import prepare_dir, write_file
from ..plotting import img_tag
from .panel_plots import overview_png, panel_palette, panel_png
from .provisioning import shipped_dashboard
from .querying import (
    DEFAULT_VARIABLES,
    QUERY_VARIABLES,
    PanelData,
    Prometheus,
    RenderError,
    fetch,
    substitutions,
)

# QUERY_VARIABLES and RenderError live in `querying`, parse_duration in `durations`;
# `dspark-obs dashboards` imports them from here, beside `render`.
__all__ = [
    "QUERY_VARIABLES",
    "RenderError",
    "Rendered",
    "data_panels",
    "index_html",
    "parse_duration",
    "render",
    "slug",
]


def data_panels(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every panel that is not a row, in dashboard order (collapsed rows nest theirs)."""
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return [p for p in out if p.get("type") != "row"]


def slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "panel"


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
        dashboard = shipped_dashboard()
    span_s, step_s = parse_duration(range_), parse_duration(step)
    prom = Prometheus(prometheus_url, timeout=timeout)
    prom.check()
    end = time.time() if end is None else end
    span = (end - span_s, end, step_s)
    values = substitutions(variables, step=step, range_=range_)
    datas = [fetch(prom, p, values, span) for p in data_panels(dashboard)]

    root = prepare_dir(out)
    written = []
    palette = panel_palette(datas)
    for i, data in enumerate(datas, start=1):
        path = root / f"{i:02d}-{slug(data.panel.get('title', ''))}.png"
        panel_png(data, path, palette)
        written.append((data, path))
    title = dashboard.get("title", "dashboard")
    when = datetime.fromtimestamp(end).strftime("%Y-%m-%d %H:%M:%S")
    chosen = ", ".join(f"{k}={v}" for k, v in {**DEFAULT_VARIABLES, **(variables or {})}.items())
    subtitle = f"{prom.url}, last {range_} to {when}, step {step}; {chosen}"
    overview = root / "overview.png"
    overview_png(datas, overview, f"{title} — last {range_}", palette=palette)
    index = root / "index.html"
    write_file(index, index_html(title, subtitle, overview, written), durable=False)
    return Rendered(written, overview, index)
