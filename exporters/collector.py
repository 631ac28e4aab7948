"""Published snapshots as Prometheus text, written through the catalog alone.

Producers (aggregates, estimator, ingest counters) hand over snapshots whose
sections hold `dspark_obs.series` parts; the collector walks the catalog in
order, writes each family's header from its entry and its samples from the
section attribute the entry names. It knows nothing of the producers' tables:
publishing a quantity is a catalog entry. Rules:

- a family whose section is absent or None (no groups yet) is not written at all;
- a present section writes every header, even of a family without series;
- NaN samples, and histogram series `keep` leaves out, are not written;
- the exporter's own labels (`engine`, `model_name`: what it observes, as a scrape
  target's labels) lead every sample's label set;
- a family of fine detail (`Metric.detail`) is written only when the collector is asked
  for detail (`--detail-metrics`).

The arithmetic was done by the producers on fixed-size arrays; a scrape is
formatting, bounded by the number of series, with label strings built once
per label set.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..series import Buckets, Exemplars, Labels, Published, Samples
from .catalog import CATALOG, Metric
from .exposition import Writer, label_string

#: Label sets whose formatted strings are kept; groups only grow, so few are ever live.
#: Sample name suffixes of counters and histograms.
_SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")
_CACHE_SIZE = 256


def bound_string(bound: float) -> str:
    """A bucket's `le`: integers as they are, fractions to 6 significant digits."""
    if isinstance(bound, (int, np.integer)):
        return str(int(bound))
    return f"{bound:.6g}"


def sample_names(family: str) -> frozenset[str]:
    """Every name a sample of the family `family` may carry in the exposition."""
    base = family.removesuffix("_total")
    return frozenset((family, base, *(base + s for s in _SUFFIXES)))


class Collector:
    """Writes the catalog's families from published snapshots; caches label strings,
    bucket bounds and headers, so a steady scrape formats numbers only."""

    def __init__(
        self,
        catalog: Sequence[Metric] = CATALOG,
        const_labels: Sequence[tuple[str, str]] = (),
        *,
        detail: bool = False,
    ) -> None:
        self.catalog = tuple(m for m in catalog if detail or not m.detail)
        const = [(n, v) for n, v in const_labels if v]  # an empty value is no label
        self._const = label_string(*zip(*const, strict=True)) if const else ""
        self._labels: dict[Labels, list[str]] = {}
        self._bounds: dict[tuple, list[str]] = {}
        self._helps: dict[tuple[str, object], str] = {}

    def collect(
        self,
        *snapshots: Published | None,
        names: frozenset[str] | None = None,
        openmetrics: bool = False,
    ) -> bytes:
        """The exposition of these snapshots (None: a producer that is not there), in
        OpenMetrics with the histograms' exemplars where `openmetrics`.

        With `names` (a scrape's `name[]=` values), only the families named, by their
        own name or one of their samples' (`_total`, `_bucket`, `_count`, `_sum`), as
        prometheus_client's restricted registry selects them.
        """
        sections: dict[str, object | None] = {}
        for snap in snapshots:
            if snap is not None:
                sections.update(snap.sections())
        w = Writer(openmetrics)
        for metric in self.catalog:
            if names is not None and not names & sample_names(metric.name):
                continue
            section_name, attr = metric.source
            section = sections.get(section_name)
            if section is None:
                continue
            w.header(metric.name, metric.kind, self._help(metric, section))
            parts = getattr(section, attr)
            for part in parts if isinstance(parts, tuple) else (parts,):
                self._write(w, metric.name, part)
        return w.text()

    def _help(self, metric: Metric, section: object) -> str:
        if "{window}" not in metric.help:
            return metric.help
        window = section.window_steps
        key = (metric.name, window)
        text = self._helps.get(key)
        if text is None:
            text = self._helps[key] = metric.help.format(window=window)
        return text

    def _strings(self, labels: Labels) -> list[str]:
        strings = self._labels.get(labels)
        if strings is None:
            if len(self._labels) >= _CACHE_SIZE:
                self._labels.clear()
            const = self._const
            strings = self._labels[labels] = [
                ",".join(filter(None, (const, label_string(labels.names, row))))
                for row in labels.rows
            ]
        return strings

    def _bound_strings(self, bounds: tuple) -> list[str]:
        strings = self._bounds.get(bounds)
        if strings is None:
            strings = self._bounds[bounds] = [*map(bound_string, bounds), "+Inf"]
        return strings

    def _write(self, w: Writer, name: str, part: Samples | Buckets) -> None:
        labels = self._strings(part.labels)
        if isinstance(part, Samples):
            w.samples(name, labels, part.values)
            return
        counts, sums, keep = part.counts, part.sums, part.keep
        rows = None
        if keep is not None:
            if not keep.any():
                return
            if not keep.all():
                labels = [s for s, k in zip(labels, keep.tolist(), strict=True) if k]
                counts, sums = counts[keep], sums[keep]
                rows = keep
        exemplars = None
        if w.openmetrics and part.exemplars is not None:
            exemplars = exemplar_strings(part.exemplars, rows)
        w.histogram(name, labels, self._bound_strings(part.bounds), counts, sums, exemplars)


def exemplar_strings(ex: Exemplars, rows: np.ndarray | None = None) -> list[str]:
    """Each bucket's OpenMetrics exemplar suffix, series by series (the `rows` that `keep`
    selects): ` # {labels} value time`, or "" where the bucket has none."""
    values = [v if rows is None else v[rows] for v in ex.values]
    observed = ex.observed if rows is None else ex.observed[rows]
    when = ex.time if rows is None else ex.time[rows]
    out = []
    for i in range(observed.shape[0]):
        for k in range(observed.shape[1]):
            first = values[0][i, k]
            if first is None:
                out.append("")
                continue
            labels = label_string(ex.names, [v[i, k] for v in values])
            out.append(f" # {{{labels}}} {observed[i, k]:g} {when[i, k]:.3f}")
    return out
