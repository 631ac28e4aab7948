"""Fit SGLang's additive step-cost table from the step times a stored run measured.

`T(bs, K) = bias + alpha(bs) + theta(M)`, `M = bs + K` = the step's
`num_verify_tokens`. The fit is SGLang's own (and the online refit's, through
the one shared `fit_cells`): steps are summed into (bs, M // 64) cells with a
polars group_by, and the cell means are solved by count-weighted least squares
with alpha and theta piecewise linear between probes. Only the cell sums ever
leave polars, so a run of millions of steps costs one scan.

The least-squares coefficients are not a table yet: the additive model is
identified only up to constants moved between bias, alpha and theta, and a
probe few or no cells reach is pinned loosely or not at all (the solver's
minimum-norm answer drops such probes towards 0, which would tell the
scheduler that huge verify batches are free). `cost_canonical.canonical_table`
fixes one documented choice, so the written table is valid (bias > 0, alpha and
theta >= 0) and the same data always give the same JSON:

1. among all least-squares solutions (every one predicts every cell exactly
   alike, so R^2 and RMS do not change) take the flattest: the one with the
   smallest sum of squared differences between neighbouring probe values of
   alpha and of theta. Probes past the data continue the last fitted value
   flat (what the table's clamping does beyond its probes anyway); probes
   between data follow the neighbours;
2. move min(alpha) and min(theta) into bias, so both curves start at 0 and
   bias is the cheapest step the table can predict;
3. should that bias still be <= 0 (no least-squares solution is a valid table:
   a noisy fit whose minimum lies at a (bs, M) pair no run reaches, since M >= bs,
   or a probe that a few steps pin loosely), take instead the valid table (bias >=
   `cost_canonical.BIAS_FLOOR`, alpha and theta >= 0) nearest to the cells in squared
   error, and say so (`constrained`); the error figures are always those of the
   table as written.

Only step 3 ever changes a prediction at a cell (its bs, M at its bin's
middle). Step 1 does choose the curves elsewhere, so per-step errors at each
step's own M may differ slightly from another least-squares solution's.

Beside that table, `cost_context` fits one with a term in the steps' context
tokens, and shows the additive table's errors by context length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
import polars as pl

from ..domain.cost_table import AdditiveCostTable
from ..domain.step_cost import (
    DEFAULT_BS_PROBES,
    DEFAULT_M_PROBES,
    M_BIN,
    MAX_STEP_S,
    MIN_STEP_S,
    Refit,
    cell_m,
    cost_design,
    fit_cells,
)
from ..store import Run, RunStoreError
from .cost_canonical import canonical_table
from .cost_context import ContextFit, fit_context
from .step_time import TIME_COLUMNS, measured_step_ms

NO_TIMES = (
    "this run has no measured step times (step_gpu_ms or step_cpu_ms); SGLang records "
    "them with the step_gpu_time or step_cpu_time components: "
    "SGLANG_DSPARK_DEBUG_DUMP=core,step_gpu_time (or SGLANG_DSPARK_ENABLE_SPS_RECORD=1, "
    "which is core,step_cpu_time)"
)


class CostFitError(ValueError):
    """The run cannot give a cost table (no steps, no times, too few cells, bad probes)."""


@dataclass(frozen=True)
class TableErrors:
    """How well one table predicts the measured step times, per step at its own (bs, M)."""

    steps: int
    r2: float
    rms_seconds: float
    rel_error_median: float
    rel_error_mean: float
    bias_seconds: float  # mean of measured - predicted

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class CostFit:
    """A fitted table, how well it and the run's own table predict the run, and the data.

    `per_step` is lazy (bs, m, measured_ms, fitted_ms, predicted_ms, residual_ms),
    so plots and notebooks can sample it without holding the run in memory;
    `cells` holds the (bs, M-bin) sums the fit was solved from.
    """

    table: AdditiveCostTable
    steps: int
    cells: int
    fitted: TableErrors
    own: TableErrors | None  # the scheduler's table, from predicted_step_ms; None if absent
    ols: Refit  # SGLang's figures (M at cell middles) and the raw minimum-norm coefficients
    bs_probes_source: str  # "option", "manifest" or "default"
    m_probes_source: str
    time_column: str
    constrained: bool  # no least-squares solution was a valid table (step 3)
    cell_frame: pl.DataFrame = field(repr=False)
    per_step: pl.LazyFrame = field(repr=False)
    context: ContextFit | None = None  # the context-extended table and its comparison
    context_missing: str | None = None  # why `context` is None

    def to_dict(self) -> dict[str, Any]:
        """The fit figures for `--json` (the table itself is `table.to_json()`)."""
        return {
            "steps": self.steps,
            "cells": self.cells,
            "time_column": self.time_column,
            "probes_source": {"bs": self.bs_probes_source, "m": self.m_probes_source},
            "fitted": self.fitted.to_dict(),
            "own": None if self.own is None else self.own.to_dict(),
            "ols": {"r2": self.ols.r2, "rms_seconds": self.ols.rms_seconds},
            "constrained": self.constrained,
            "context": None if self.context is None else self.context.to_dict(),
            "context_missing": self.context_missing,
        }


def check_probes(name: str, probes) -> tuple[int, ...]:
    """Probes as ints, refused unless positive and strictly increasing."""
    out = tuple(int(p) for p in probes)
    if not out:
        raise CostFitError(f"{name} probes are empty")
    if out[0] < 1 or any(b <= a for a, b in pairwise(out)):
        shown = ",".join(str(p) for p in out)
        raise CostFitError(f"{name} probes must be positive and strictly increasing, got {shown}")
    return out


def cover(defaults, lo: float, hi: float) -> tuple[int, ...]:
    """The default probes from the last one <= lo to the first one >= hi (all if outside)."""
    p = np.asarray(defaults)
    start = max(int(np.searchsorted(p, lo, side="right")) - 1, 0)
    stop = min(int(np.searchsorted(p, hi, side="left")), len(p) - 1)
    return tuple(int(x) for x in p[start : stop + 1])


def interp_expr(x: pl.Expr, xp, fp) -> pl.Expr:
    """`np.interp(x, xp, fp)` as a polars expression: linear between probes, clamped."""
    xp = [float(v) for v in xp]
    fp = [float(v) for v in fp]
    if len(xp) == 1:
        return pl.lit(fp[0], dtype=pl.Float64)
    expr = pl.when(x <= xp[0]).then(pl.lit(fp[0], dtype=pl.Float64))
    for k in range(len(xp) - 1):
        slope = (fp[k + 1] - fp[k]) / (xp[k + 1] - xp[k])
        expr = expr.when(x <= xp[k + 1]).then(fp[k] + (x - xp[k]) * slope)
    return expr.otherwise(pl.lit(fp[-1], dtype=pl.Float64))


def table_seconds_expr(table: AdditiveCostTable, bs: pl.Expr, m: pl.Expr) -> pl.Expr:
    """`table.step_seconds(bs, m - bs)` per row, without leaving polars."""
    return (
        pl.lit(table.bias_seconds, dtype=pl.Float64)
        + interp_expr(bs.cast(pl.Float64), table.bs_probes, table.alpha_seconds)
        + interp_expr(m.cast(pl.Float64), table.m_probes, table.theta_seconds)
    )


def timed_steps(steps: pl.LazyFrame, time_column: str = "auto") -> pl.LazyFrame:
    """Steps a fit can use: bs > 0, tokens > 0, a measured time within the step-time bounds.

    Columns: bs, m (verify tokens), measured_s, predicted_s (the run's own
    table, null where the step has none) and context_tokens where the steps table
    has it (runs written before it existed lack it); `time_column` as
    `measured_step_ms`.
    """
    if time_column not in TIME_COLUMNS:
        raise CostFitError(f"time column must be one of {', '.join(TIME_COLUMNS)}")
    schema = steps.collect_schema()
    for need in ("bs", "num_verify_tokens"):
        if need not in schema:
            raise CostFitError(f"the steps table has no {need!r} column")
    if "predicted_step_ms" in schema:
        p = pl.col("predicted_step_ms").cast(pl.Float64) / 1e3
        predicted = pl.when(p.abs() <= MAX_STEP_S).then(p)
    else:
        predicted = pl.lit(None, dtype=pl.Float64)
    y = pl.col("measured_s")
    return steps.select(
        pl.col("bs").cast(pl.Int64),
        pl.col("num_verify_tokens").cast(pl.Int64).alias("m"),
        (measured_step_ms(time_column) / 1e3).alias("measured_s"),
        predicted.alias("predicted_s"),
        *([pl.col("context_tokens").cast(pl.Int64)] if "context_tokens" in schema else []),
    ).filter((pl.col("bs") > 0) & (pl.col("m") > 0) & y.is_between(MIN_STEP_S, MAX_STEP_S))


def cell_sums(timed: pl.LazyFrame) -> pl.DataFrame:
    """One row per (bs, M-bin): count, sum and sum of squares of seconds, M extent."""
    y = pl.col("measured_s")
    return (
        timed.group_by("bs", (pl.col("m") // M_BIN).alias("m_bin"))
        .agg(
            n=pl.len(),
            s=y.sum(),
            ss=(y * y).sum(),
            m_lo=pl.col("m").min(),
            m_hi=pl.col("m").max(),
        )
        .sort("bs", "m_bin")
        .collect()
    )


def manifest_probes(manifest: dict, key: str) -> tuple[int, ...] | None:
    """The run's own table's probes (run.json `cost_table`), when it recorded an SPS table."""
    table = manifest.get("cost_table")
    probes = table.get(key) if isinstance(table, dict) else None
    if isinstance(probes, list) and probes and all(isinstance(p, (int, float)) for p in probes):
        return tuple(int(p) for p in probes)
    return None


def table_errors(frame: pl.LazyFrame, column: str) -> pl.LazyFrame:
    """Error figures of the predictions in `column` against measured_s (rows with both)."""
    y, f = pl.col("measured_s"), pl.col(column)
    return (
        frame.filter(f.is_not_null())
        .select(
            steps=pl.len(),
            sse=((y - f) ** 2).sum(),
            sst=((y - y.mean()) ** 2).sum(),
            rel_error_median=((y - f).abs() / y).median(),
            rel_error_mean=((y - f).abs() / y).mean(),
            bias_seconds=(y - f).mean(),
        )
        .with_columns(pl.col("steps").cast(pl.Int64))
    )


def _to_errors(row: dict[str, Any]) -> TableErrors | None:
    n = int(row["steps"])
    if n == 0:
        return None
    sst = row["sst"]
    return TableErrors(
        steps=n,
        r2=1.0 - row["sse"] / sst if sst and sst > 0 else float("nan"),
        rms_seconds=float(np.sqrt(row["sse"] / n)),
        rel_error_median=float(row["rel_error_median"]),
        rel_error_mean=float(row["rel_error_mean"]),
        bias_seconds=float(row["bias_seconds"]),
    )


def fitted_frame(timed: pl.LazyFrame, table: AdditiveCostTable) -> pl.LazyFrame:
    """Per step: bs, m, measured, fitted, run's own prediction and residual, in ms."""
    fitted = table_seconds_expr(table, pl.col("bs"), pl.col("m"))
    return timed.with_columns(fitted_s=fitted).select(
        "bs",
        "m",
        (pl.col("measured_s") * 1e3).alias("measured_ms"),
        (pl.col("fitted_s") * 1e3).alias("fitted_ms"),
        (pl.col("predicted_s") * 1e3).alias("predicted_ms"),
        ((pl.col("measured_s") - pl.col("fitted_s")) * 1e3).alias("residual_ms"),
    )


def fit_cost_table(
    run: Run,
    *,
    bs_probes=None,
    m_probes=None,
    time_column: str = "auto",
) -> CostFit:
    """Fit the additive table to `run`'s measured step times; see the module docstring.

    Probes: those given, else the run's own table's (run.json `cost_table`),
    else the defaults trimmed to the observed range.
    """
    try:
        steps = run.steps()
    except RunStoreError as exc:
        raise CostFitError(f"no steps table ({exc})") from exc
    return fit_cost_steps(
        steps, run.manifest, bs_probes=bs_probes, m_probes=m_probes, time_column=time_column
    )


def fit_cost_steps(
    steps: pl.LazyFrame,
    manifest: dict,
    *,
    bs_probes=None,
    m_probes=None,
    time_column: str = "auto",
) -> CostFit:
    """`fit_cost_table` on any steps table (one run's, or a fleet's runs' of one hardware
    concatenated), with `manifest` the run.json whose `cost_table` gives the probes."""
    timed = timed_steps(steps, time_column)
    return fit_cost_cells(
        cell_sums(timed), timed, manifest, bs_probes=bs_probes, m_probes=m_probes,
        time_column=time_column,
    )  # fmt: skip


def fit_cost_cells(
    cells: pl.DataFrame,
    timed: pl.LazyFrame,
    manifest: dict,
    *,
    bs_probes=None,
    m_probes=None,
    time_column: str = "auto",
) -> CostFit:
    """`fit_cost_steps` from its `cell_sums` and the timed steps its errors, per-step frame
    and context fit read. The cells add across runs, so a fleet read elsewhere brings them
    whole; `timed` may then be a sample of the steps (`report.fleet_map`): the table is the
    cells' either way, and `steps` counts every timed step the cells hold."""
    if cells.height == 0:
        raise CostFitError(NO_TIMES)
    if cells.height < 2:
        raise CostFitError(
            f"all {int(cells['n'].sum()):,} timed steps fall in one (bs, M//{M_BIN}) cell; "
            "the fit needs at least 2 (steps at other batch sizes or verify sizes)"
        )
    bs = cells["bs"].to_numpy().astype(np.float64)
    m = cell_m(cells["m_bin"].to_numpy())
    probes = {}
    for name, given, key, defaults, lo, hi in (
        ("bs", bs_probes, "bs_probes", DEFAULT_BS_PROBES, bs.min(), bs.max()),
        (
            "m",
            m_probes,
            "m_probes",
            DEFAULT_M_PROBES,
            min(m.min(), cells["m_lo"].min()),
            max(m.max(), cells["m_hi"].max()),
        ),
    ):
        if given is not None:
            probes[name] = (check_probes(name, given), "option")
        elif (recorded := manifest_probes(manifest, key)) is not None:
            probes[name] = (check_probes(name, recorded), "manifest")
        else:
            probes[name] = (cover(defaults, lo, hi), "default")
    (bs_p, bs_src), (m_p, m_src) = probes["bs"], probes["m"]
    n = cells["n"].to_numpy().astype(np.float64)
    ols = fit_cells(bs, m, n, cells["s"].to_numpy(), cells["ss"].to_numpy(), bs_p, m_p)
    weighted = cost_design(bs, m, bs_p, m_p) * np.sqrt(n)[:, None]
    table, constrained = canonical_table(ols.coef, bs_p, m_p, weighted)
    per_step = fitted_frame(timed, table)
    with_fit = timed.with_columns(fitted_s=table_seconds_expr(table, pl.col("bs"), pl.col("m")))
    fitted_row, own_row = (
        f.row(0, named=True)
        for f in pl.collect_all(
            [table_errors(with_fit, "fitted_s"), table_errors(with_fit, "predicted_s")]
        )
    )
    cell_frame = cells.with_columns(
        m=pl.Series(m),
        mean_ms=pl.col("s") / pl.col("n") * 1e3,
        fitted_ms=pl.Series(table.step_seconds(bs, m - bs) * 1e3),
    )
    context, context_missing = fit_context(timed, table, bs_p, m_p)
    return CostFit(
        table=table,
        steps=int(n.sum()),
        cells=cells.height,
        fitted=_to_errors(fitted_row),
        own=_to_errors(own_row),
        ols=ols,
        bs_probes_source=bs_src,
        m_probes_source=m_src,
        time_column=time_column,
        constrained=constrained,
        cell_frame=cell_frame,
        per_step=per_step,
        context=context,
        context_missing=context_missing,
    )
