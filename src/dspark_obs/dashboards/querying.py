"""Each data panel's series, straight from Prometheus' HTTP API, without Grafana.

What Grafana would do before drawing: replace the template variables in a panel's queries,
run them over a time range and turn the answers into labelled series (cumulative `le`
buckets into counts per bucket for the heatmap format). Kept apart from the drawing so that
everything that can fail on the network or on a refused query fails here, as `RenderError`.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..json_files import decode_json
from ..sources.sglang_http import (
    HTTPStatusError,
    RedirectRefused,
    ResponseTooLarge,
    SGLangClient,
)

# Grafana's built-in interval variables and the dashboard's query variables ("All" is `.*`).
QUERY_VARIABLES = ("engine", "model_name", "cluster", "instance", "workload", "mode", "rank")
DEFAULT_VARIABLES: dict[str, str] = {name: ".*" for name in QUERY_VARIABLES}
RATE_INTERVAL = "1m"

_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


class RenderError(Exception):
    """Prometheus could not be reached or refused a query; the message is one line."""


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


#: Bytes of one Prometheus answer: a panel's range over a dashboard's span is a few MB at
#: most; a bigger answer is refused after this many bytes, not held whole.
MAX_ANSWER_BYTES = 32 << 20


class _Series(msgspec.Struct):
    metric: dict[str, str] = {}
    values: list[tuple[float, str]] = []


class _Data(msgspec.Struct):
    resultType: str = ""
    result: msgspec.Raw = msgspec.Raw(b"[]")


class _Answer(msgspec.Struct):
    status: str
    data: msgspec.Raw = msgspec.Raw(b"null")
    error: str = ""


class Prometheus:
    """Prometheus' query API through the package's bounded client (`sources.sglang_http`):
    each call ends within `timeout` seconds in all (connect, headers and body, however the
    server paces them), reads at most `MAX_ANSWER_BYTES`, follows redirects within the
    origin only, and its answer is checked against the API's shapes before use, so a broken
    or hostile server is one `RenderError`, never a traceback."""

    def __init__(self, url: str, timeout: float = 10.0) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise RenderError(f"--prometheus must be an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._client = SGLangClient(self.url, timeout=timeout, max_bytes=MAX_ANSWER_BYTES)

    def _api(self, path: str, params: Mapping[str, str]) -> msgspec.Raw:
        query = f"{path}?{urllib.parse.urlencode(params)}"
        try:
            raw = self._client.request(query)
        except HTTPStatusError as exc:
            raw = exc.body  # Prometheus says why in a JSON body of its 4xx
            if not raw:
                raise RenderError(
                    f"Prometheus at {self.url} answered HTTP {exc.code} for {path}"
                ) from None
        except (RedirectRefused, ResponseTooLarge, TimeoutError) as exc:
            raise RenderError(f"Prometheus at {self.url}: {path}: {exc}") from None
        except OSError as exc:
            raise RenderError(f"cannot reach Prometheus at {self.url}: {exc}") from None
        except ValueError as exc:  # a truncated answer
            raise RenderError(f"Prometheus at {self.url}: {path}: {exc}") from None
        try:
            answer = decode_json(bytes(raw), _Answer)
        except ValueError as exc:
            detail = " ".join(str(exc).split())[:200]
            raise RenderError(
                f"Prometheus at {self.url}: {path}: not an API answer: {detail}"
            ) from None
        if answer.status != "success":
            detail = " ".join((answer.error or answer.status).split())[:500]
            raise RenderError(f"Prometheus at {self.url} refused {path}: {detail}")
        return answer.data

    def check(self) -> None:
        self._api("/api/v1/query", {"query": "1"})

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        raw = self._api(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        try:
            data = decode_json(bytes(raw), _Data)
            if data.resultType != "matrix":
                return []
            series = decode_json(bytes(data.result), list[_Series])
        except ValueError as exc:
            detail = " ".join(str(exc).split())[:200]
            raise RenderError(
                f"Prometheus at {self.url}: /api/v1/query_range: not a range answer: {detail}"
            ) from None
        return [{"metric": s.metric, "values": s.values} for s in series]


# -- data ----------------------------------------------------------------------------------


@dataclass
class Series:
    label: str
    times: list[float]
    values: list[float]
    le: float | None = None  # heatmap-format bucket bound
    workload: str | None = None  # the series' `workload` label, which picks its colour

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
                    workload=metric.get("workload"),
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
