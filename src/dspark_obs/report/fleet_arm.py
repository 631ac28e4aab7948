"""Many runs as one arm: the nodes and ranks of one fleet, read a run at a time.

Every view is built from sums that add across runs (`store/fleet.py` decides which runs
and whether they can be merged; the summary, the estimate and the calibration
histograms are the `summary`, `estimate` and `calibration` commands' own fleet folds), so
the fleet arm's figures are those of the union of the runs' rows without ever holding
that union. The drill-down takes each run's top requests and keeps the fleet's top among
them (a request lives on one run), its ids prefixed with the run's node.
"""

from __future__ import annotations

import polars as pl

from ..analysis.cost_fit import CostFitError, fit_cost_steps
from ..analysis.load import fleet_load_curve
from ..analysis.reliability import fleet_histograms, group_entries, per_workload
from ..analysis.summary import summarize_fleet
from ..analysis.trim_loss import (
    request_steps_with_ceiling,
    request_traces,
    top_requests,
    trimmed_with_ceiling,
)
from ..analysis.verify_lengths import fleet_window_shares
from ..estimator.evaluate import walked_blocks
from ..estimator.fleet import fleet_evaluate
from ..store.fleet import Fleet
from .arms import TRACED_REQUESTS, Arm, has_requests

FLEET_LABEL = "fleet"


def _cost(fleet: Fleet):
    """The step-cost model of the fleet's steps together (one hardware: one table)."""
    steps = pl.concat([r.steps() for r in fleet.runs], how="diagonal_relaxed")
    try:
        return fit_cost_steps(steps, {"cost_table": fleet.common("cost_table")}), None
    except CostFitError as exc:
        return None, str(exc)


def _drill_down(fleet: Fleet, top: int) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    gamma = fleet.gamma
    rows, tops = [], []
    for i, (run, node) in enumerate(zip(fleet.runs, fleet.nodes, strict=True)):
        own = request_steps_with_ceiling(run, walked_blocks(run)).with_columns(
            pl.format("{}/{}", pl.lit(node), pl.col("rid")).alias("rid")
        )
        rows.append(own)
        if trimmed_with_ceiling(own, gamma) > 0:
            tops.append(top_requests(own, top).with_columns(pl.lit(i).alias("run")))
    if not tops:
        return None, None
    best = (
        pl.concat(tops, how="vertical_relaxed")
        .sort(["trim_loss", "rid"], descending=[True, False])
        .head(top)
    )
    traced = best.head(TRACED_REQUESTS)
    traces = pl.concat(
        [
            request_traces(rows[i], part["rid"].to_list())
            for (i,), part in traced.group_by("run", maintain_order=True)
        ],
        how="vertical_relaxed",
    ).sort("rid", "prefix_len")
    return best.drop("run"), traces


def analyse_fleet(fleet: Fleet, by: tuple[str, ...], top: int) -> Arm:
    """The fleet's light analyses; `fleet_estimate` and `fleet_calibration` fill the rest."""
    for run in fleet.runs:
        if not has_requests(run):
            raise ValueError(
                f"{run.path}: no request-steps (a block-accept-only ingest); "
                "`dspark-obs estimate` reads those"
            )
    cost, cost_missing = _cost(fleet)
    best, traces = _drill_down(fleet, top)
    return Arm(
        label=FLEET_LABEL,
        run=fleet.runs[0],
        gamma=fleet.gamma,
        summary=summarize_fleet(fleet, by),
        shares=fleet_window_shares([r.requests() for r in fleet.runs], fleet.gamma),
        load=fleet_load_curve(fleet.runs, fleet.nodes),
        estimate=None,
        calibration={},
        cost=cost,
        cost_missing=cost_missing,
        top=best,
        traces=traces,
        fleet=fleet,
        by=by,
    )


def fleet_estimate(arm: Arm) -> None:
    assert arm.fleet is not None
    arm.estimate = fleet_evaluate(arm.fleet, arm.by)


def fleet_calibration(arm: Arm) -> None:
    """Both stages' histograms added over the runs, pooled per workload, and per group."""
    assert arm.fleet is not None
    groups = fleet_histograms(arm.fleet, by=arm.by)
    arm.calibration = {stage: per_workload(g) for stage, g in groups.items()}
    arm.calibration_groups = {stage: group_entries(g, arm.by) for stage, g in groups.items()}
