"""The fleet report's light views as a map over runs and a reduce: what one run gives
(`run_part`, wherever the run is read) and how the runs' parts are added (`LightFold`).

Each view keeps the definition it has for the in-process fleet, since that is now this
map and reduce on the in-process engine:

* summary: `analysis.summary.fold_run`, added by `summary_of_folds`;
* window shares: `window_counts` per run, added (`fleet_window_shares`);
* load curve: sums per (batch size, node/rank) (`fleet_load_sums`), pooled into the
  fleet's levels once every run's batch sizes are known (`fleet_load_of_sums`);
* cost fit: the (bs, M-bin) cell sums, which add, give the table; its error figures, the
  per-step frame and the context fit read the timed steps themselves, which do not add,
  so each run brings a bounded sample: its `COST_SAMPLE` steps of smallest hash priority
  (a hash of the run and the step's position), and the fleet keeps the `COST_SAMPLE`
  smallest over all runs (the smallest of a union are among each part's smallest, so the
  fold is exact, and holds one run's sample beside the fleet's). Up to `COST_SAMPLE`
  timed steps that is every step, in the runs' order, and the fit is the concatenated
  steps' own;
* drill-down: a request lives on one run, so the fleet's top requests are among the
  runs' own tops (ids prefixed with the node), and the traced ones among each run's first
  `TRACED_REQUESTS`, whose traces the run brings along.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..analysis.cost_fit import NO_TIMES, CostFitError, cell_sums, fit_cost_cells, timed_steps
from ..analysis.load import fleet_load_of_sums, fleet_load_sums
from ..analysis.summary import fold_run
from ..analysis.trim_loss import (
    request_steps_with_ceiling,
    request_traces,
    top_requests,
    trimmed_with_ceiling,
)
from ..analysis.verify_lengths import fleet_window_shares, window_counts
from ..estimator.evaluate import walked_blocks
from ..store import Run
from .arms import TRACED_REQUESTS, has_requests

#: Timed steps the fleet's cost errors and context fit read at most (every step up to it).
COST_SAMPLE = 200_000

_CELL_SUMS = ("n", "s", "ss")


@dataclass
class RunPart:
    """One run's share of the fleet arm's light views (a few rows each, and the sample)."""

    summary: tuple
    windows: pl.DataFrame
    load: pl.DataFrame
    cells: pl.DataFrame | None  # None: the run's steps give no fit (`cost_error`)
    sample: pl.DataFrame | None  # timed steps with `_priority` and `_row`
    cost_error: str | None
    top: pl.DataFrame | None  # None: no trimmed step with a known ceiling
    traces: pl.DataFrame | None


def _priorities(seed: int, n: int) -> np.ndarray:
    """splitmix64 of `seed + i`: a step's sampling priority, the same on every machine."""
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) + np.uint64(seed) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _seed(node: str, manifest: dict) -> int:
    """A run's seed from its node and manifest, so copies of one run on two nodes sample
    different steps, and one run samples the same ones wherever it is read."""
    text = node + "\0" + json.dumps(manifest, sort_keys=True, default=str)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _smallest(frame: pl.DataFrame, k: int) -> pl.DataFrame:
    if frame.height <= k:
        return frame
    keep = np.argpartition(frame["_priority"].to_numpy(), k - 1)[:k]
    return frame[np.sort(keep)]


def _cost_part(run: Run, node: str) -> tuple[pl.DataFrame | None, pl.DataFrame | None, str | None]:
    try:
        timed = timed_steps(run.steps()).collect()
    except CostFitError as exc:
        return None, None, str(exc)
    cells = cell_sums(timed.lazy()).with_columns(pl.col("n").cast(pl.Int64))
    sample = timed.with_columns(
        _priority=pl.Series(_priorities(_seed(node, run.manifest), timed.height)),
        _row=pl.int_range(timed.height, dtype=pl.Int64),
    )
    return cells, _smallest(sample, COST_SAMPLE), None


def _drill_part(run: Run, node: str, top: int):
    own = request_steps_with_ceiling(run, walked_blocks(run)).with_columns(
        pl.format("{}/{}", pl.lit(node), pl.col("rid")).alias("rid")
    )
    if trimmed_with_ceiling(own, run.gamma) == 0:
        return None, None
    best = top_requests(own, top)
    return best, request_traces(own, best["rid"].head(TRACED_REQUESTS).to_list())


def run_part(run: Run, node: str, by: tuple[str, ...], top: int) -> RunPart:
    """One run's part of the fleet arm: the map (`dspark_obs.engine` runs it where the run is)."""
    if not has_requests(run):
        raise ValueError(
            f"{run.path}: no request-steps (a block-accept-only ingest); "
            "`dspark-obs estimate` reads those"
        )
    cells, sample, cost_error = _cost_part(run, node)
    best, traces = _drill_part(run, node, top)
    return RunPart(
        summary=fold_run(run, node, by),
        windows=window_counts(run.requests()),
        load=fleet_load_sums(run, node),
        cells=cells,
        sample=sample,
        cost_error=cost_error,
        top=best,
        traces=traces,
    )


@dataclass
class LightFold:
    """The runs' parts added as they arrive: the cost sample folded in at once (so only the
    fleet's and one run's are held), the rest kept per run (a few rows each)."""

    sample: pl.DataFrame | None = None
    cost_errors: list[str] = field(default_factory=list)

    def keep(self, index: int, part: RunPart) -> RunPart:
        """`part` with its sample folded into the fleet's (for `read_fleet`'s `keep`)."""
        if part.sample is not None:
            own = part.sample.with_columns(_run=pl.lit(index, dtype=pl.Int64))
            both = own if self.sample is None else pl.concat([self.sample, own], how="diagonal")
            self.sample = _smallest(both, COST_SAMPLE)
        if part.cost_error is not None:
            self.cost_errors.append(part.cost_error)
        part.sample = None
        return part

    def cost(self, parts: list[RunPart], manifest: dict):
        """The fleet's cost fit (None and why where its steps give none)."""
        cells = [p.cells for p in parts if p.cells is not None and p.cells.height]
        if not cells or self.sample is None:
            return None, self.cost_errors[0] if self.cost_errors else NO_TIMES
        added = (
            pl.concat(cells, how="vertical_relaxed")
            .group_by("bs", "m_bin")
            .agg(
                pl.col(_CELL_SUMS).sum(),
                pl.col("m_lo").min(),
                pl.col("m_hi").max(),
            )
            .sort("bs", "m_bin")
        )
        timed = self.sample.sort("_run", "_row").drop("_run", "_row", "_priority")
        try:
            return fit_cost_cells(added, timed.lazy(), manifest), None
        except CostFitError as exc:
            return None, str(exc)


def shares(parts: list[RunPart], gamma: int) -> pl.DataFrame:
    return fleet_window_shares([p.windows for p in parts], gamma)


def load(parts: list[RunPart]) -> pl.DataFrame:
    return fleet_load_of_sums([p.load for p in parts])


def drill_down(parts: list[RunPart], top: int) -> tuple[pl.DataFrame | None, pl.DataFrame | None]:
    """The fleet's top requests from the runs' tops, and the traces of its first ones."""
    tops = [
        p.top.with_columns(pl.lit(i).alias("run")) for i, p in enumerate(parts) if p.top is not None
    ]
    if not tops:
        return None, None
    best = (
        pl.concat(tops, how="vertical_relaxed")
        .sort(["trim_loss", "rid"], descending=[True, False], maintain_order=True)
        .head(top)
    )
    traced = best.head(TRACED_REQUESTS)
    traces = pl.concat(
        [
            parts[i].traces.filter(pl.col("rid").is_in(part["rid"].to_list()))
            for (i,), part in traced.group_by("run", maintain_order=True)
        ],
        how="vertical_relaxed",
    ).sort("rid", "prefix_len")
    return best.drop("run"), traces
