"""Prometheus text exposition (format 0.0.4), and OpenMetrics, written straight from arrays.

prometheus_client builds a Python object per sample and formats each one; at
the exporter's scale (thousands of per-position series) that costs far more
than the 10 ms a scrape may take. Here label sets are strings built once per
series, values come from numpy arrays, and a family is one list comprehension.

A scraper that asks for OpenMetrics (Prometheus does, first) gets it: the same samples,
a counter's family named without its `_total`, `# EOF` last, and on a histogram's buckets
the exemplars its producer keeps (a recent observation's labels, value and time), which
Prometheus stores with `--enable-feature=exemplar-storage`.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable, Iterable, Sequence
from urllib.parse import parse_qs

import numpy as np

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_string(names: Sequence[str], values: Sequence[object]) -> str:
    return ",".join(f'{n}="{escape(str(v))}"' for n, v in zip(names, values, strict=True))


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _values(values: np.ndarray) -> list[str]:
    if values.dtype.kind in "iu":
        return [str(v) for v in values.tolist()]
    if np.isfinite(values).all():
        return [repr(v) for v in values.tolist()]
    return [_fmt(v) for v in values.tolist()]


_PREFIXES: dict[tuple, list[str]] = {}
_PREFIX_CACHE_SIZE = 256


def _histogram_prefixes(name: str, labels: tuple[str, ...], bounds: tuple[str, ...]) -> list[str]:
    """Every line of a histogram family up to its value; label sets rarely change, so cached."""
    key = (name, labels, bounds)
    cached = _PREFIXES.get(key)
    if cached is None:
        if len(_PREFIXES) >= _PREFIX_CACHE_SIZE:
            _PREFIXES.clear()
        cached = []
        for lab in labels:
            sep = "," if lab else ""
            braces = f"{{{lab}}}" if lab else ""
            cached += [f'{name}_bucket{{{lab}{sep}le="{b}"}} ' for b in bounds]
            cached += [f"{name}_sum{braces} ", f"{name}_count{braces} "]
        _PREFIXES[key] = cached
    return cached


class Writer:
    """Accumulates families; `text()` joins them once. `openmetrics`: OpenMetrics 1.0."""

    def __init__(self, openmetrics: bool = False) -> None:
        self.parts: list[str] = []
        self.openmetrics = openmetrics

    def header(self, name: str, kind: str, help_text: str) -> None:
        help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        if self.openmetrics and kind == "counter":
            name = name.removesuffix("_total")  # the family; its samples keep the suffix
        self.parts.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")

    def samples(self, name: str, labels: Sequence[str], values: np.ndarray) -> None:
        """One sample per label string; NaN values are skipped (no data is no sample)."""
        values = np.asarray(values)
        if values.dtype.kind == "f":
            keep = ~np.isnan(values)
            if not keep.all():
                labels = [lab for lab, k in zip(labels, keep.tolist(), strict=True) if k]
                values = values[keep]
        self.parts.append(
            "".join(
                [
                    f"{name}{{{lab}}} {v}\n" if lab else f"{name} {v}\n"
                    for lab, v in zip(labels, _values(values), strict=True)
                ]
            )
        )

    def histogram(
        self,
        name: str,
        labels: Sequence[str],
        bounds: Sequence[str],
        counts: np.ndarray,
        sums: np.ndarray,
        exemplars: list[str] | None = None,
    ) -> None:
        """Per series: non-cumulative bucket counts `[series, len(bounds)]` (`bounds` as
        written, the last "+Inf");
        `exemplars`, in OpenMetrics, a suffix (` # {...} value time`, or "") per bucket."""
        cum = np.cumsum(np.asarray(counts), axis=1)
        width = len(bounds) + 2
        values: list[str | None] = [None] * (len(labels) * width)
        for k in range(len(bounds)):
            values[k::width] = [str(v) for v in cum[:, k].tolist()]
        values[width - 2 :: width] = _values(np.asarray(sums))
        values[width - 1 :: width] = [str(v) for v in cum[:, -1].tolist()]
        if exemplars is not None and self.openmetrics:
            buckets = len(bounds)  # the bounds' strings end with "+Inf"
            for k in range(len(bounds)):
                values[k::width] = [v + e for v, e in zip(
                    values[k::width], exemplars[k::buckets], strict=True)]  # fmt: skip
        prefixes = _histogram_prefixes(name, tuple(labels), tuple(bounds))
        self.parts.append("".join([f"{p}{v}\n" for p, v in zip(prefixes, values, strict=True)]))

    def text(self) -> bytes:
        if self.openmetrics:
            self.parts.append("# EOF\n")
        return "".join(self.parts).encode()


def asked_names(query: str) -> frozenset[str] | None:
    """The `name[]=` values of a /metrics query (None: no filter), as Prometheus clients
    send them to scrape a few families; prometheus_client's exporters honour them."""
    names = parse_qs(query, keep_blank_values=True).get("name[]")
    return frozenset(names) if names else None


def wants_openmetrics(accept: str) -> bool:
    """Whether an `Accept` header asks for OpenMetrics (Prometheus lists it first)."""
    return "application/openmetrics-text" in accept


def wsgi_app(
    render: Callable[[frozenset[str] | None, bool], bytes],
) -> Callable[[dict, Callable], Iterable[bytes]]:
    """A WSGI app serving `render(names, openmetrics)` as text exposition, OpenMetrics where
    the scraper asks for it, gzipped when it asks; `names` are the families a `name[]=`
    query restricts it to (None: all)."""

    def app(environ, start_response):
        openmetrics = wants_openmetrics(environ.get("HTTP_ACCEPT", ""))
        body = render(asked_names(environ.get("QUERY_STRING", "")), openmetrics)
        headers = [("Content-Type", OPENMETRICS_TYPE if openmetrics else CONTENT_TYPE)]
        if "gzip" in environ.get("HTTP_ACCEPT_ENCODING", ""):
            body = gzip.compress(body, compresslevel=1)
            headers.append(("Content-Encoding", "gzip"))
        headers.append(("Content-Length", str(len(body))))
        start_response("200 OK", headers)
        return [body]

    return app
