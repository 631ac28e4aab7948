"""Each run of a report is an *arm*: its light analyses, held together for every section.

The sections read arms, never runs, so a run is opened and analysed once however many
sections and figures draw on it; fields a run cannot support stay None and the sections
turn them into `missing` lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from ..analysis.cost_fit import CostFit, CostFitError, fit_cost_table
from ..analysis.load import load_curve
from ..analysis.reliability import calibration_histograms
from ..analysis.summary import summarize
from ..analysis.trim_loss import (
    request_steps_with_ceiling,
    request_traces,
    top_requests,
    trimmed_with_ceiling,
)
from ..analysis.verify_lengths import window_shares
from ..calibration import CalibrationAccumulator
from ..estimator.evaluate import evaluate, walked_blocks
from ..palette import workload_palette
from ..store import Run
from ..store.fleet import FleetHead
from ..whatif.predict import whatif
from ..whatif.trim_cost import trim_cost_from_cells

#: Requests whose step-by-step windows are drawn in the drill-down.
TRACED_REQUESTS = 4

#: Request-steps above which `report` and `compare` leave the what-if predictions to
#: `dspark-obs whatif`: they cost about 10 s of CPU and 0.8 GB a million request-steps
#: (docs/whatif.md), which would take a 10M-step report far past its budget.
WHATIF_MAX_REQUEST_STEPS = 1_000_000


@dataclass
class Arm:
    """One run's analyses; fields are None where the run cannot support the view."""

    label: str
    run: Run | None  # None for a fleet arm: its runs are read where they are (`fleet_arm`)
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
    whatif: dict | None = None  # `whatif` of `report_policies`, with its `trim_cost`
    whatif_missing: str | None = None
    fleet: FleetHead | None = None  # the runs a fleet arm merges: paths, nodes, manifests
    by: tuple[str, ...] = ()  # the fleet's breakdown keys (node, rank, mode)
    calibration_groups: dict[str, list[dict]] = field(default_factory=dict)
    source: Any = None  # a fleet arm's `fleet_arm.FleetSource`, for its later passes
    unread: list[dict] = field(default_factory=list)  # a fleet's runs left out, and why

    @property
    def manifests(self) -> list[dict]:
        if self.fleet is not None:
            return self.fleet.manifests
        assert self.run is not None
        return [self.run.manifest]

    def manifest_value(self, key: str) -> object:
        """A run.json value of the arm: the run's, or the one every run of a fleet shares."""
        return self.fleet.common(key) if self.fleet is not None else self.manifests[0].get(key)


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
    rows = request_steps_with_ceiling(run, walked_blocks(run))
    known = trimmed_with_ceiling(rows, gamma) > 0
    best = top_requests(rows, top) if known else None
    traces = None
    if best is not None:
        traces = request_traces(rows, best["rid"].head(TRACED_REQUESTS).to_list())
    return light_arm(
        label,
        gamma,
        summarize(run),
        window_shares(run.requests(), gamma),
        load_curve(run),
        _cost_fit(run),
        (best, traces),
        run=run,
    )


def _cost_fit(run: Run) -> tuple[CostFit | None, str | None]:
    """The run's fitted cost table, or None and why it could not be fitted."""
    try:
        return fit_cost_table(run), None
    except CostFitError as exc:
        return None, str(exc)


def light_arm(
    label: str,
    gamma: int,
    summary: dict,
    shares: pl.DataFrame,
    load: pl.DataFrame,
    cost: tuple[CostFit | None, str | None],
    drill_down: tuple[pl.DataFrame | None, pl.DataFrame | None],
    **where: Any,
) -> Arm:
    """An arm of the light views, a run's or a fleet's alike (`where` says which: `run`,
    or a fleet's `fleet`, `by`, `source` and `unread`); the later passes fill in
    `estimate` and `calibration`. `cost` is the fit or why there is none, `drill_down`
    the top requests and their traces (None where no ceiling is known)."""
    (fit, cost_missing), (top, traces) = cost, drill_down
    return Arm(
        label=label,
        gamma=gamma,
        summary=summary,
        shares=shares,
        load=load,
        estimate=None,
        calibration={},
        cost=fit,
        cost_missing=cost_missing,
        top=top,
        traces=traces,
        **where,
    )


def report_policies(arm: Arm) -> list[str]:
    """What the report predicts: the run's own policy, static, the SPS scheduler (left out
    of a compact run, whose own windows are the scheduler's), with half its budget and
    without STS, and a fixed window of the run's mean size (as many verify tokens, not
    chosen per request). Each policy costs a pass over the run, so none is repeated."""
    mean = arm.summary["overall"]["mean_window"] or 1
    k = min(max(1, round(mean)), arm.gamma - 1)
    sps = [] if arm.manifest_value("mode") == "compact" else ["sps"]
    return ["own", "static", *sps, "sps:scale=0.5", "sps:sts=none", f"window={k}"]


def too_large_for_whatif(run: Run) -> str | None:
    """Why the run is left to `dspark-obs whatif`, or None where the report predicts it."""
    n = run.requests().select(pl.len()).collect().item() if has_requests(run) else 0
    if n <= WHATIF_MAX_REQUEST_STEPS:
        return None
    return (
        f"{n:,} request-steps, more than the {WHATIF_MAX_REQUEST_STEPS:,} the report and "
        f"compare predict other policies for (see docs/whatif.md); "
        f"`dspark-obs whatif {run.path}` predicts them on its own"
    )


def predict_run(run: Run, policies: list[str]) -> tuple[dict | None, str | None]:
    """The what-if of `policies` on `run` (those it supports, the others under
    `unavailable`) with its cost of trimming, or None and why nothing could be predicted."""
    missing = too_large_for_whatif(run)
    if missing:
        return None, missing
    try:
        report = whatif(run, policies, skip_unavailable=True, same_steps=("static",))
    except ValueError as exc:
        return None, str(exc)
    own = [c for c in report["cells"] if c["policy"] == "own"]
    report["trim_cost"] = trim_cost_from_cells(own + report.pop("same_steps_cells"))
    return report, None


def predict_policies(arm: Arm) -> None:
    """Fill `arm.whatif`, or `arm.whatif_missing` with why nothing could be predicted (a
    run's arm; a fleet's is `fleet_arm.fleet_predict`)."""
    assert arm.run is not None
    arm.whatif, arm.whatif_missing = predict_run(arm.run, report_policies(arm))


def run_calibration(arm: Arm) -> None:
    """Fill `arm.calibration` (a run's arm; a fleet's is `fleet_arm.fleet_calibration`)."""
    arm.calibration = calibration_histograms(arm.run)


def run_estimate(arm: Arm) -> None:
    """Fill `arm.estimate` (a run's arm; a fleet's is `fleet_arm.fleet_estimate`)."""
    arm.estimate = evaluate(arm.run)
