"""Published series: the data model every producer's snapshot is made of.

A producer (the live aggregates, the ceiling estimator, the ingest counters)
publishes its figures as `Samples` (one value per series: counters and gauges)
and `Buckets` (one distribution per series: histograms), each over a `Labels`
table of label names and one row of label values per series. A snapshot names
its sections (`sections()`); a section's attributes are the published
quantities, each a part or a tuple of parts of one family.

Nothing here is about a wire format: values are numbers and label values are
plain values, never escaped or formatted. How they are written is the
publisher's business (exporters/), and the producers' tables stay their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Labels:
    """Label names and one row of label values per series, in series order.

    Compared by value and hashed once, so that what a publisher derives from a
    label set (its formatted strings) can be kept per label set; a producer that
    hands out the same object while its groups stay the same makes that lookup O(1).
    """

    __slots__ = ("_hash", "names", "rows")

    def __init__(self, names: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
        self.names = tuple(names)
        self.rows = tuple(tuple(r) for r in rows)
        self._hash = hash((self.names, self.rows))

    def __len__(self) -> int:
        return len(self.rows)

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Labels):
            return NotImplemented
        return self._hash == other._hash and self.names == other.names and self.rows == other.rows

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Labels({self.names!r}, {len(self.rows)} rows)"


@dataclass(frozen=True, eq=False)
class Samples:
    """One value per series of `labels` (a counter or a gauge); NaN: no data, no sample."""

    labels: Labels
    values: np.ndarray  # [series]


@dataclass(frozen=True, eq=False)
class Buckets:
    """One histogram per series of `labels`, or per series that `keep` selects.

    `bounds` are the finite upper bounds, increasing (ints or floats); `counts`
    holds each bucket's own count (not cumulative), one column per bound and a
    last one for values above every bound; `sums` the sum of the observed values.
    """

    labels: Labels
    bounds: tuple[float, ...]
    counts: np.ndarray  # [series, len(bounds) + 1]
    sums: np.ndarray  # [series]
    keep: np.ndarray | None = None  # [series] bool: the series published; None: all
    #: a recent observation per bucket, where the producer keeps one: its labels and when
    exemplars: Exemplars | None = None


@dataclass(frozen=True, eq=False)
class Exemplars:
    """Per series and bucket (`[series, len(bounds) + 1]`): a recent observation's label
    values (`names`, one array each; None where the bucket has none), value and Unix time."""

    names: tuple[str, ...]
    values: tuple[np.ndarray, ...]
    observed: np.ndarray  # the observed value
    time: np.ndarray


Part = Samples | Buckets


class Published(Protocol):
    """A producer's snapshot: its sections by name, None where it has nothing to publish."""

    def sections(self) -> Mapping[str, object | None]: ...


def ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where den > 0, else NaN (no data)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
