"""Step cost against context length: where SGLang's additive table drifts, and a table that
follows it.

The additive table T(bs, K) has no term for context, but verify attends each request's
block to that request's whole KV cache, so at one (bs, K) a step costs more as its
requests' conversations grow. The steps table's `context_tokens` (the sum of the step's
`prefix_len`) gives two views:

* the residuals of the additive table by context bucket (mean context per request,
  `CONTEXT_BUCKETS`, the exporter's buckets): a signed relative error that climbs
  with context is the table drifting as conversations grow;
* an extended table (`ContextCostTable`): the additive model plus `c * context_tokens`,
  fitted by the same least squares over the same (bs, M-bin) cells, its additive part
  made canonical as SGLang's (`cost_fit.canonical_table`).

How much better the extension predicts is measured on steps neither fit saw: steps
alternate in row order between a fitting half and a scoring half (both span the
run), both models are fitted on the first and scored on the second, each step's
design taken at its cell's middle M as in SGLang's fit. A gain is then what the
context term predicts, not the extra freedom of one more coefficient.

The context term in cell sums: a step's design row is its cell's `d` plus its own
context x, so the per-step least squares needs per cell the count n and the sums
of x, y, x^2 and xy. Two rows per cell give exactly that objective (up to a
constant): `[sqrt(n) d, Sx / sqrt(n)] -> Sy / sqrt(n)` and
`[0, sd] -> (Sxy - Sx Sy / n) / sd` with `sd^2 = Sxx - Sx^2 / n`, the spread of
x within the cell; a cell whose steps share one context needs only the first.
Unlike the additive fit, this one takes four numbers per step out of polars (the
halves and the buckets need each step), all further work vectorised in numpy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from ..domain.cost_table import AdditiveCostTable, ContextCostTable
from ..domain.step_cost import CONTEXT_BUCKETS, M_BIN, cell_m, context_bucket, cost_design
from .cost_canonical import canonical_table

#: Fewest timed steps with a context for the held-out comparison (each half needs cells).
MIN_CONTEXT_STEPS = 8

NO_CONTEXT_COLUMN = (
    "the steps table has no context_tokens column (the run was written before steps "
    "recorded their context)"
)
NO_CONTEXT_STEPS = (
    "no timed step carries its requests' context (context_tokens is null: the steps were "
    "recorded without request rows; SGLang gives prefix_len only with the reqs component)"
)


@dataclass(frozen=True)
class HeldOut:
    """One model's errors on the scoring half."""

    steps: int
    r2: float
    rms_seconds: float
    rel_error_mean: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ContextBucket:
    """Errors of both written tables over the steps of one context bucket (in sample).

    `*_rel_bias` is the mean of (measured - predicted) / measured: positive where the
    table is optimistic; `*_rel_error` the mean of its absolute value.
    """

    context: int  # the bucket's lower bound, mean context tokens per request
    steps: int
    mean_context: float
    additive_rel_bias: float
    additive_rel_error: float
    extended_rel_bias: float
    extended_rel_error: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class ContextFit:
    table: ContextCostTable
    steps: int  # timed steps with a context, all of them behind `table`
    additive: HeldOut
    extended: HeldOut
    buckets: list[ContextBucket] = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "context_seconds_per_token": self.table.context_seconds_per_token,
            "held_out": {"additive": self.additive.to_dict(), "extended": self.extended.to_dict()},
            "by_context": [b.to_dict() for b in self.buckets],
        }


@dataclass(frozen=True)
class _Steps:
    bs: np.ndarray
    m_bin: np.ndarray
    context: np.ndarray
    y: np.ndarray

    def part(self, keep: np.ndarray) -> _Steps:
        return _Steps(self.bs[keep], self.m_bin[keep], self.context[keep], self.y[keep])


def _cells(s: _Steps) -> tuple[np.ndarray, np.ndarray]:
    """Unique (bs, M-bin) cells of the steps, and each step's cell."""
    cells, inverse = np.unique(np.stack([s.bs, s.m_bin], axis=1), axis=0, return_inverse=True)
    return cells, inverse.reshape(-1)


def _design(cells: np.ndarray, bs_probes, m_probes) -> np.ndarray:
    return cost_design(cells[:, 0].astype(np.float64), cell_m(cells[:, 1]), bs_probes, m_probes)


def _solve(s: _Steps, bs_probes, m_probes, with_context: bool) -> tuple[np.ndarray, np.ndarray]:
    """Least-squares coefficients `[additive..., c]` (c = 0 without context), and the cells'
    count-weighted additive design (what `canonical_table` needs); see the module docstring."""
    cells, inv = _cells(s)
    n = np.bincount(inv).astype(np.float64)
    sy = np.bincount(inv, weights=s.y)
    w = np.sqrt(n)
    weighted = _design(cells, bs_probes, m_probes) * w[:, None]
    if not with_context:
        coef, *_ = np.linalg.lstsq(weighted, sy / w, rcond=None)
        return np.append(coef, 0.0), weighted
    # context in units of its mean, so both parts of the design have comparable scale
    scale = max(float(s.context.mean()), 1.0)
    x = s.context / scale
    sx = np.bincount(inv, weights=x)
    sxx = np.bincount(inv, weights=x * x)
    sxy = np.bincount(inv, weights=x * s.y)
    sd = np.sqrt(np.maximum(sxx - sx * sx / n, 0.0))
    spread = sd > 1e-12 * np.maximum(np.sqrt(sxx), 1.0)
    rows = np.vstack(
        [
            np.hstack([weighted, (sx / w)[:, None]]),
            np.hstack([np.zeros((int(spread.sum()), weighted.shape[1])), sd[spread, None]]),
        ]
    )
    rhs = np.concatenate([sy / w, (sxy - sx * sy / n)[spread] / sd[spread]])
    coef, *_ = np.linalg.lstsq(rows, rhs, rcond=None)
    coef[-1] /= scale
    return coef, weighted


def _predict(coef: np.ndarray, s: _Steps, bs_probes, m_probes) -> np.ndarray:
    """Each step's prediction, its design at its cell's middle M (computed once per cell)."""
    cells, inv = _cells(s)
    return (_design(cells, bs_probes, m_probes) @ coef[:-1])[inv] + coef[-1] * s.context


def _score(y: np.ndarray, f: np.ndarray) -> HeldOut:
    sse = float(((y - f) ** 2).sum())
    sst = float(((y - y.mean()) ** 2).sum())
    return HeldOut(
        steps=len(y),
        r2=1.0 - sse / sst if sst > 0 else float("nan"),
        rms_seconds=float(np.sqrt(sse / len(y))),
        rel_error_mean=float((np.abs(y - f) / y).mean()),
    )


def _buckets(s: _Steps, additive: np.ndarray, extended: np.ndarray) -> list[ContextBucket]:
    """Per context bucket with steps: both tables' signed and absolute relative errors."""
    mean_context = s.context / s.bs
    k = context_bucket(mean_context)
    nb = len(CONTEXT_BUCKETS)
    n = np.bincount(k, minlength=nb)

    def mean(values: np.ndarray) -> np.ndarray:
        return np.bincount(k, weights=values, minlength=nb) / np.maximum(n, 1)

    rel_a, rel_e = (s.y - additive) / s.y, (s.y - extended) / s.y
    figures = [mean(v) for v in (mean_context, rel_a, np.abs(rel_a), rel_e, np.abs(rel_e))]
    return [
        ContextBucket(CONTEXT_BUCKETS[i], int(n[i]), *(float(f[i]) for f in figures))
        for i in np.flatnonzero(n)
    ]


def fit_context(
    timed: pl.LazyFrame,
    additive: AdditiveCostTable,
    bs_probes,
    m_probes,
) -> tuple[ContextFit | None, str | None]:
    """The extended table, its held-out comparison and the by-context view; or why not.

    `timed` is `cost_fit.timed_steps` (bs, m, measured_s, context_tokens), `additive`
    the table `cost fit` writes (the view's baseline).
    """
    if "context_tokens" not in timed.collect_schema():
        return None, NO_CONTEXT_COLUMN
    frame = (
        # a negative context is a recording error (prefix_len arrives unchecked), left out
        timed.filter(pl.col("context_tokens") >= 0)
        .select("bs", "m", "context_tokens", "measured_s")
        .collect()
    )
    if frame.height == 0:
        return None, NO_CONTEXT_STEPS
    if frame.height < MIN_CONTEXT_STEPS:
        return None, f"only {frame.height} timed steps carry a context (need {MIN_CONTEXT_STEPS})"
    bs = frame["bs"].to_numpy()
    steps = _Steps(
        bs,
        frame["m"].to_numpy() // M_BIN,
        frame["context_tokens"].to_numpy().astype(np.float64),
        frame["measured_s"].to_numpy(),
    )
    fitting = np.arange(frame.height) % 2 == 0
    train, test = steps.part(fitting), steps.part(~fitting)
    held = [
        _score(
            test.y, _predict(_solve(train, bs_probes, m_probes, c)[0], test, bs_probes, m_probes)
        )
        for c in (False, True)
    ]
    coef, weighted = _solve(steps, bs_probes, m_probes, True)
    part, _ = canonical_table(coef[:-1], bs_probes, m_probes, weighted)
    table = ContextCostTable(part, float(coef[-1]))
    m = frame["m"].to_numpy()
    fitted_additive = additive.step_seconds(bs, m - bs)
    fitted_extended = table.step_seconds(bs, m - bs, steps.context)
    return (
        ContextFit(
            table=table,
            steps=frame.height,
            additive=held[0],
            extended=held[1],
            buckets=_buckets(steps, fitted_additive, fitted_extended),
        ),
        None,
    )
