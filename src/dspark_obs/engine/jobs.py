"""The fleet commands over an engine: each command's map (the analysis module's per-run
fold) on every partition, then its reduce on the driver, with the unread partitions named.

The maps and reduces are the ones `summarize_fleet`, `fleet_calibration_report` and
`fleet_evaluate` use in process, so a figure has one definition whichever engine read it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis import reliability, summary
from ..estimator import fleet as estimator_fleet
from ..store import Run
from ..store.errors import RunStoreError
from ..store.fleet import FleetHead, check_mergeable
from .base import Engine, MapFn, PartitionRead, Unread
from .partitions import Partition, partitions_of


@dataclass(frozen=True)
class FleetRead:
    """The partitions' partials with the fleet's header, and the partitions left unread."""

    head: FleetHead
    partials: list
    unread: list[Unread]
    read_on: list[str | None]
    #: the partitions read, in the partials' order (a later pass reads these again)
    partitions: list[Partition] = field(default_factory=list)


def read_fleet(
    engine: Engine,
    paths: list[str | Path],
    fn: MapFn,
    args: tuple,
    by: tuple[str, ...] = (),
    keep: Callable[[int, Any], Any] | None = None,
) -> FleetRead:
    """`fn` over every partition under `paths`; refused where nothing could be read or the
    runs read cannot be merged (`store.fleet.check_mergeable`).

    `keep(i, partial)` is what is held of the i-th partial read, called as each arrives:
    a reduce that folds a large part of it (a sample) in at once holds one, not all."""
    partitions = partitions_of(paths, engine.discover)
    read: list[PartitionRead] = []
    partials, unread, placed = [], [], []
    for partition, result in zip(partitions, engine.imap(fn, partitions, args), strict=True):
        if isinstance(result, Unread):
            unread.append(result)
            continue
        partials.append(result.partial if keep is None else keep(len(read), result.partial))
        read.append(dataclasses.replace(result, partial=None))
        placed.append(partition)
    if not read:
        raise RunStoreError(
            "no partition could be read: " + "; ".join(f"{u.path}: {u.error}" for u in unread)
        )
    paths_read = [r.path for r in read]
    manifests = [r.manifest for r in read]
    check_mergeable(paths_read, manifests, by)
    head = FleetHead(paths_read, [r.node for r in read], manifests)
    return FleetRead(head, partials, unread, [r.read_on for r in read], placed)


def read_again(engine: Engine, fleet: FleetRead, fn: MapFn, args: tuple) -> list:
    """`fn` over the partitions `fleet` read, for a later pass over the same runs; a run
    that cannot be read this time is an error (the passes' figures would not match)."""
    out = []
    for result in engine.imap(fn, fleet.partitions, args):
        if isinstance(result, Unread):
            raise RunStoreError(f"{result.path}: read before, unreadable now: {result.error}")
        out.append(result.partial)
    return out


def unread_line(fleet: FleetRead) -> str:
    """`N of M runs unreadable: PATH: why; ...`, one line."""
    total = len(fleet.unread) + len(fleet.partials)
    listed = "; ".join(f"{u.path}: {u.error}" for u in fleet.unread)
    return f"{len(fleet.unread)} of {total} runs unreadable: {listed}"


def with_unread(result: dict, fleet: FleetRead) -> dict:
    """`result` naming the partitions it leaves out (only where there are any)."""
    if fleet.unread:
        result["unread"] = [{"path": u.path, "error": u.error} for u in fleet.unread]
    return result


def estimate_map(run: Run, node: str, by: tuple[str, ...]) -> tuple:
    return estimator_fleet.fold_run(run, node, run.gamma, by)


def _whatif_map(run: Run, node: str, policies, use_shadow: bool) -> dict:
    from ..whatif.predict import whatif

    return whatif(run, policies, use_shadow=use_shadow)


def summary_job(engine: Engine, paths, by: tuple[str, ...] = ()) -> tuple[dict, FleetRead]:
    fleet = read_fleet(engine, paths, summary.fold_run, (by,), by)
    return with_unread(summary.summary_of_folds(fleet.head, fleet.partials, by), fleet), fleet


def calibration_job(
    engine: Engine, paths, bins: int = 15, by: tuple[str, ...] = ()
) -> tuple[dict, FleetRead]:
    if bins < 1:
        raise ValueError("--bins must be >= 1")
    stages = (reliability.RECORDED,)
    fleet = read_fleet(engine, paths, reliability.run_histograms, (stages, bins, by), by)
    report = reliability.calibration_of_histograms(fleet.head, fleet.partials, bins, by)
    return with_unread(report, fleet), fleet


def estimate_job(engine: Engine, paths, by: tuple[str, ...] = ()) -> tuple[dict, FleetRead]:
    fleet = read_fleet(engine, paths, estimate_map, (by,), by)
    report = estimator_fleet.evaluate_folds(fleet.head, fleet.partials, by)
    return with_unread(report, fleet), fleet


def whatif_job(
    engine: Engine, path, policies=None, use_shadow: bool = True
) -> tuple[dict, FleetRead]:
    """One run's what-if where the run lives: it has no fleet reduce (a policy's replay
    needs the run's steps in order), so one task reads it and returns the predictions."""
    fleet = read_fleet(engine, [path], _whatif_map, (policies, use_shadow))
    if fleet.unread or len(fleet.partials) != 1:
        where = "; ".join(f"{u.path}: {u.error}" for u in fleet.unread)
        raise RunStoreError(where or f"{path}: whatif reads one run, not {len(fleet.partials)}")
    return fleet.partials[0], fleet
