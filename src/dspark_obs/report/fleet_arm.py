"""Many runs as one arm: the nodes and ranks of one fleet, read a run at a time, in this
process or on Ray (`dspark_obs.engine`), the same map and reduce either way.

Every view is built from what adds across runs (`store/fleet.py` decides whether the runs
can be merged; the summary, the estimate and the calibration histograms are the
`summary`, `estimate` and `calibration` commands' own fleet folds; the window shares, the
load curve, the cost fit and the drill-down are `fleet_map`'s), so the fleet arm's
figures are those of the union of the runs' rows without ever holding that union. The
light views come from one pass over the runs; the estimator's and the calibration's
passes read the same runs again later, so the light figures draw meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..analysis.reliability import (
    RAW,
    RECORDED,
    add_histograms,
    group_entries,
    per_workload,
    run_histograms,
)
from ..analysis.summary import summary_of_folds
from ..engine import Engine
from ..engine.jobs import FleetRead, estimate_map, read_again, read_fleet, unread_line
from ..estimator.fleet import evaluate_folds
from ..store.errors import RunStoreError
from .arms import Arm, light_arm, predict_run, report_policies
from .fleet_map import LightFold, drill_down, load, run_part, shares

FLEET_LABEL = "fleet"

#: Calibration bins of the report (the `calibration` command's default).
_BINS = 15


@dataclass(frozen=True)
class FleetSource:
    """Where a fleet arm's runs are read, for its later passes: the engine and the first
    pass's partitions (those it read; any it could not are `unread`)."""

    engine: Engine
    read: FleetRead


def analyse_fleet(
    engine: Engine, paths: list[str | Path], by: tuple[str, ...], top: int, strict: bool = True
) -> Arm:
    """The fleet's light analyses; `fleet_estimate` and `fleet_calibration` fill the rest.
    A run that cannot be read is an error with `strict`, else named in `arm.unread`."""
    fold = LightFold()
    read = read_fleet(engine, paths, run_part, (by, top), by, keep=fold.keep)
    if read.unread and strict:
        raise RunStoreError(unread_line(read))
    head, parts = read.head, read.partials
    return light_arm(
        FLEET_LABEL,
        head.gamma,
        summary_of_folds(head, [p.summary for p in parts], by),
        shares(parts, head.gamma),
        load(parts),
        fold.cost(parts, {"cost_table": head.common("cost_table")}),
        drill_down(parts, top),
        run=None,
        fleet=head,
        by=by,
        source=FleetSource(engine, read),
        unread=[{"path": u.path, "error": u.error} for u in read.unread],
    )


def _source(arm: Arm) -> FleetSource:
    assert isinstance(arm.source, FleetSource)
    return arm.source


def fleet_estimate(arm: Arm) -> None:
    src = _source(arm)
    folds = read_again(src.engine, src.read, estimate_map, (arm.by,))
    arm.estimate = evaluate_folds(src.read.head, folds, arm.by)


def fleet_calibration(arm: Arm) -> None:
    """Both stages' histograms added over the runs, pooled per workload, and per group."""
    src = _source(arm)
    stages = (RECORDED, RAW)
    parts = read_again(src.engine, src.read, run_histograms, (stages, _BINS, arm.by))
    groups = add_histograms(parts, stages)
    arm.calibration = {stage: per_workload(g) for stage, g in groups.items()}
    arm.calibration_groups = {stage: group_entries(g, arm.by) for stage, g in groups.items()}


def _predict_map(run, node: str, policies: list[str]) -> tuple:
    return predict_run(run, policies)


def fleet_predict(arm: Arm) -> None:
    """A fleet of one run is predicted where the run is read; the predictions' intervals
    are not sums, so a fleet of several runs is left to `whatif` per run."""
    src = _source(arm)
    if len(src.read.head.paths) > 1:
        arm.whatif_missing = (
            f"predicted per run, not for a fleet of {len(src.read.head.paths)} runs: "
            "`dspark-obs whatif RUN_DIR` on each, or `dspark-obs report --arms RUN_DIR...`"
        )
        return
    [(arm.whatif, arm.whatif_missing)] = read_again(
        src.engine, src.read, _predict_map, (report_policies(arm),)
    )
