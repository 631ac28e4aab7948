"""Each run of a report is an *arm*: its light analyses, held together for every section.

The sections read arms, never runs, so a run is opened and analysed once however many
sections and figures draw on it; fields a run cannot support stay None and the sections
turn them into `missing` lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from ..analysis.cost_fit import CostFit, CostFitError, fit_cost_table
from ..analysis.load import load_curve
from ..analysis.summary import summarize
from ..analysis.trim_loss import (
    request_steps_with_ceiling,
    request_traces,
    top_requests,
    trimmed_with_ceiling,
)
from ..analysis.verify_lengths import window_shares
from ..calibration import CalibrationAccumulator
from ..estimator.evaluate import walked_blocks
from ..palette import workload_palette
from ..store import Run

#: Requests whose step-by-step windows are drawn in the drill-down.
TRACED_REQUESTS = 4


@dataclass
class Arm:
    """One run's analyses; fields are None where the run cannot support the view."""

    label: str
    run: Run
    gamma: int
    summary: dict
    shares: pl.DataFrame
    load: pl.DataFrame
    estimate: dict | None
    calibration: dict[str, dict[str | None, CalibrationAccumulator]]
    cost: CostFit | None
    cost_missing: str | None
    top: pl.DataFrame | None
    traces: pl.DataFrame | None
    notes: list[str] = field(default_factory=list)


def arms_palette(arms: list[Arm]) -> dict[str | None, str]:
    """Workload colours over every arm, so a workload keeps its colour across runs and figures."""
    return workload_palette(name for arm in arms for name in arm.summary["workloads"])


def has_requests(run: Run) -> bool:
    return "requests" in run.tables()


def analyse(label: str, run: Run, top: int) -> Arm:
    """The light analyses of one run; `estimate` and `calibration` are filled in later.

    The heavy passes (the estimator's evaluation, calibration histograms) run
    after the light views' figures are queued, so that a large run's figures
    render in the figure worker while those passes run here.
    """
    gamma = run.gamma
    if not has_requests(run):
        raise ValueError(
            f"{run.path}: no request-steps (a block-accept-only ingest); "
            "`dspark-obs estimate` reads those"
        )
    try:
        cost, cost_missing = fit_cost_table(run), None
    except CostFitError as exc:
        cost, cost_missing = None, str(exc)
    rows = request_steps_with_ceiling(run, walked_blocks(run))
    known = trimmed_with_ceiling(rows, gamma) > 0
    best = top_requests(rows, top) if known else None
    traces = None
    if best is not None:
        traces = request_traces(rows, best["rid"].head(TRACED_REQUESTS).to_list())
    return Arm(
        label=label,
        run=run,
        gamma=gamma,
        summary=summarize(run),
        shares=window_shares(run.requests(), gamma),
        load=load_curve(run),
        estimate=None,
        calibration={},
        cost=cost,
        cost_missing=cost_missing,
        top=best,
        traces=traces,
    )
