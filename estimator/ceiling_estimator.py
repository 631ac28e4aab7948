"""The ceiling estimator in service: walks and the population model, per step, in band.

Every request-step is one of three kinds. Rejected inside its window, or
verified whole: its ceiling is observed exactly. Trimmed with the window fully
accepted: its ceiling is censored, and the tail walk estimates it once later
steps reveal the tail (or the request ends). Trimmed but unwalkable (a sampled
request without log-probabilities, or a source that does not say how the
request samples): skipped, and only the population model speaks for it.

Counts and sums per (workload, mode, rank) group are kept cumulatively and over
a sliding window, like the live aggregates, so the exporter can publish the
estimated mean ceiling beside the observed one; each walked block also becomes
a row of the run store's `ceilings` table.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import polars as pl

from dspark_obs.aggregates.groups import GroupIndex
from dspark_obs.aggregates.published import RequestLabels, request_labels
from dspark_obs.aggregates.window import WindowedSums
from dspark_obs.domain.cost_table import DEFAULT_CAPTURE_TIERS
from dspark_obs.series import Samples, ratio
from dspark_obs.telemetry import StepBatch

from . import compiled
from .extrapolation_check import CheckedExtrapolation, ExtrapolationCheck
from .population import HazardModel, QueuedStep
from .tails import GROUP, Gather, TailWalker
from .trim_cost import TRIM_COLUMNS, StepCost, TrimCostFold, TrimCostSeries

#: Per-group columns of the windowed sums.
COLUMNS = (
    "observed_blocks",  # ceiling seen exactly (rejection inside the window, or no trim)
    "observed_sum",
    "trimmed_blocks",  # opened a walk
    "skipped_blocks",  # trimmed, no walk possible
    "greedy_exact",
    "greedy_censored",
    "sampled_resolved",
    "sampled_censored",
    "lo_sum",  # over walked blocks
    "point_sum",
    "hi_sum",
    "var_sum",  # sampled blocks: variance of the realised ceiling around the point
    *TRIM_COLUMNS,  # the cost of trimming against static (trim_cost.py)
)
_COL = {name: i for i, name in enumerate(COLUMNS)}
#: The columns counted from the queued rows alone, first in `COLUMNS` (the compiled count
#: gives them in this order).
_COUNT_COLUMNS = ("observed_blocks", "observed_sum", "trimmed_blocks", "skipped_blocks")
assert COLUMNS[: len(_COUNT_COLUMNS)] == _COUNT_COLUMNS
#: The count column of a walked block, by 2 * greedy + censored.
_KIND_COLUMNS = [
    _COL[name]
    for name in ("sampled_resolved", "sampled_censored", "greedy_exact", "greedy_censored")
]

#: Steps whose rows the population model learns from at once (its hazards move slowly):
#: at B = 256 about 8,192 rows, enough to amortise its ~50 numpy calls, few enough that
#: its temporaries stay in cache. With the walker emitting every 32 steps too, the
#: estimator's per-step cost at B = 256 fell by about 8 % against 16 (bench/RESULTS.md).
POPULATION_BATCH_STEPS = 32


@dataclass
class EstimatorSnapshot:
    gamma: int
    groups: list[tuple[str, str, int]]
    total: np.ndarray  # [groups, len(COLUMNS)]
    window: np.ndarray
    pending: np.ndarray  # [groups] open walks now
    survival: np.ndarray  # [groups, gamma] population survival
    identifiable: np.ndarray  # [groups, gamma]
    window_steps: int  # of the window sums

    def sections(self) -> dict[str, EstimatorSeries | TrimCostSeries | None]:
        """What this snapshot publishes: nothing until a request group exists."""
        if not self.groups:
            return {"estimator": None, "trim_cost": None}
        labels = request_labels(tuple(self.groups), self.gamma)
        return {
            "estimator": EstimatorSeries(labels, self),
            "trim_cost": TrimCostSeries(labels, self.total, self.window, _COL, self.window_steps),
        }


#: Count columns of walked blocks, the denominators of the mean ceiling with observed_blocks.
_WALKED = ("greedy_exact", "greedy_censored", "sampled_resolved", "sampled_censored")


@dataclass(eq=False)
class EstimatorSeries:
    """What the estimator publishes per request group: block counts, open walks, the
    estimated mean ceiling and the population survival per position."""

    labels: RequestLabels
    snap: EstimatorSnapshot

    @property
    def window_steps(self) -> int:
        return self.snap.window_steps

    def _count(self, table: np.ndarray, column: str, source: str | None = None) -> Samples:
        labels = self.labels.request if source is None else self.labels.tagged(source)
        return Samples(labels, table[:, _COL[column]].astype(np.int64))

    @property
    def trimmed_blocks(self) -> Samples:
        return self._count(self.snap.total, "trimmed_blocks")

    @property
    def skipped_blocks(self) -> Samples:
        return self._count(self.snap.total, "skipped_blocks")

    @property
    def resolved_blocks(self) -> tuple[Samples, Samples]:
        tot = self.snap.total
        return (
            self._count(tot, "greedy_exact", "greedy"),
            self._count(tot, "sampled_resolved", "sampled"),
        )

    @property
    def censored_blocks(self) -> tuple[Samples, Samples]:
        tot = self.snap.total
        return (
            self._count(tot, "greedy_censored", "greedy"),
            self._count(tot, "sampled_censored", "sampled"),
        )

    def _sum(self, column: str) -> Samples:
        return Samples(self.labels.request, self.snap.total[:, _COL[column]])

    @property
    def observed_blocks(self) -> Samples:
        return self._count(self.snap.total, "observed_blocks")

    @property
    def observed_ceiling_tokens(self) -> Samples:
        return self._sum("observed_sum")

    @property
    def walk_lower_tokens(self) -> Samples:
        return self._sum("lo_sum")

    @property
    def walk_point_tokens(self) -> Samples:
        return self._sum("point_sum")

    @property
    def walk_upper_tokens(self) -> Samples:
        return self._sum("hi_sum")

    @property
    def pending_blocks(self) -> Samples:
        return Samples(self.labels.request, self.snap.pending.astype(np.int64))

    @staticmethod
    def _mean(table: np.ndarray, key: str) -> np.ndarray:
        """Mean ceiling per block: observed ceilings and the walks' `key` estimates."""
        walked = sum(table[:, _COL[k]] for k in _WALKED)
        blocks = table[:, _COL["observed_blocks"]] + walked
        return ratio(table[:, _COL["observed_sum"]] + table[:, _COL[key]], blocks)

    @property
    def ceiling_estimate(self) -> tuple[Samples, Samples]:
        return (
            Samples(self.labels.tagged("walk"), self._mean(self.snap.window, "point_sum")),
            Samples(self.labels.tagged("population"), np.nansum(self.snap.survival, axis=1)),
        )

    @property
    def ceiling_estimate_lower(self) -> Samples:
        return Samples(self.labels.request, self._mean(self.snap.window, "lo_sum"))

    @property
    def ceiling_estimate_upper(self) -> Samples:
        return Samples(self.labels.request, self._mean(self.snap.window, "hi_sum"))

    @property
    def ceiling_estimate_cumulative(self) -> Samples:
        return Samples(self.labels.request, self._mean(self.snap.total, "point_sum"))

    @property
    def population_survival(self) -> Samples:
        return Samples(self.labels.position, self.snap.survival.ravel())

    @property
    def population_identifiable(self) -> Samples:
        return Samples(self.labels.position, self.snap.identifiable.ravel().astype(np.int64))


class CeilingEstimator:
    def __init__(
        self,
        gamma: int,
        *,
        workload_cap: int = 16,
        window_steps: int = 1024,
        segments: int = 8,
        assume_greedy: bool | None = None,
        step_cost: StepCost | None = None,
        capture_tiers: tuple[int, ...] | None = None,
    ) -> None:
        """`step_cost` gives a step's cost table by (mode, rank) for the cost of trimming
        (`trim_cost.py`; None: no table, those sums stay 0); `capture_tiers` the captured
        verify tiers its steps round up to (None: the defaults)."""
        self.gamma = gamma
        self.index = GroupIndex(workload_cap)
        self.walker = TailWalker(gamma, assume_greedy=assume_greedy)
        self.population = HazardModel(gamma)
        # the walks' extrapolation, with its held-out check on known positions
        self.check = ExtrapolationCheck(gamma)
        self.extrapolation = CheckedExtrapolation(self.population, self.check)
        self.sums = WindowedSums(len(COLUMNS), window_steps, segments)
        self.trim = TrimCostFold(
            gamma, step_cost or (lambda mode, rank: None), capture_tiers or DEFAULT_CAPTURE_TIERS
        )
        self._rows: list[dict[str, np.ndarray]] = []
        self._population_rows: list[QueuedStep] = []
        self._counts: list[tuple] = []  # per-step row classes not yet folded into the sums
        self._lock = threading.Lock()

    def update(self, batch: StepBatch, gather: Gather | None = None) -> None:
        """Fold one validated step in (call in step order per rank)."""
        with self._lock:
            if not batch.has_reqs or batch.num_reqs == 0:
                return
            group = self.index.rows([batch])
            n_groups = len(self.index.groups)
            self.sums.ensure_groups(n_groups)
            self.population.ensure_groups(n_groups)
            self.trim.ensure_groups(self.index.groups)
            w, a = batch.window, batch.accepted
            # the population model learns in batches (its hazards move slowly; the walks'
            # extrapolation reads them between batches)
            self._population_rows.append(
                QueuedStep(
                    group, w, a, batch.confidence, batch.greedy,
                    batch.target_logprobs, batch.draft_logprobs, batch.forward_ct,
                )
            )  # fmt: skip
            if len(self._population_rows) >= POPULATION_BATCH_STEPS:
                self._teach_population()
            outcomes = self.walker.step(batch, group, gather, self.extrapolation)
            self._counts.append((group, w, a, self.walker.opened_rows, self.walker.skipped_rows))
            self.trim.queue(batch, group, w, self.walker.opened_rows)
            # counts fold in with the walk's outcomes, never across a window block's end
            if outcomes or len(self._counts) >= self.sums.room:
                self._fold(outcomes)

    def _fold(self, outcomes: dict) -> None:
        """Sum the queued steps (and the walk's outcomes) per group into the windowed sums.

        One histogram per column over all queued rows: cheaper than gathering each
        column's rows first, at a few groups and thousands of rows.
        """
        counts, self._counts = self._counts, []
        n = self.sums.groups
        delta = np.zeros((len(COLUMNS), n))  # column-major: each histogram fills one row
        kernels = compiled.KERNELS
        if counts and kernels is not None:
            delta[: len(_COUNT_COLUMNS)] = kernels.count_rows(counts, self.gamma, n)
        elif counts:
            group, w, a, opened, skipped = (
                np.concatenate([c[i] for c in counts]) for i in range(5)
            )
            observed = (a < w) | (w == self.gamma)
            delta[_COL["observed_blocks"]] = np.bincount(group, observed, n)
            delta[_COL["observed_sum"]] = np.bincount(group, a * observed, n)
            delta[_COL["trimmed_blocks"]] = np.bincount(group, opened, n)
            delta[_COL["skipped_blocks"]] = np.bincount(group, skipped, n)
        if outcomes:
            self._fold_outcomes(outcomes, delta)
        self.trim.fold(delta, _COL, outcomes, self.population)
        self.sums.add(delta.T)
        self.sums.advance(len(counts))

    def _teach_population(self) -> None:
        """The queued rows are checked against the population model, then taught to it."""
        rows, self._population_rows = self._population_rows, []
        if rows:
            top = self.check.observe_steps(self.population, rows)
            self.population.update_steps(rows, top)

    def _fold_outcomes(self, out: dict, delta: np.ndarray) -> None:
        n = delta.shape[1]
        g = out["group"]
        # (greedy, censored) as 0..3 picks the block's count column
        kind = 2 * out["greedy"] + (out["status"] == 2)
        delta[_KIND_COLUMNS] += np.bincount(kind * n + g, minlength=4 * n).reshape(4, n)
        for name in ("lo", "point", "hi", "var"):
            delta[_COL[f"{name}_sum"]] += np.bincount(g, out[name], n)
        self._rows.append(out)

    def close(self) -> None:
        """Censor the walks still open (the source ended) and count them."""
        with self._lock:
            self._teach_population()
            out = self.walker.close(self.extrapolation)
            if out or self._counts:
                self._fold(out)

    def take_rows(self) -> pl.DataFrame | None:
        """Walked blocks since the last call, as rows of the `ceilings` table."""
        with self._lock:
            rows, self._rows = self._rows, []
        if not rows:
            return None
        cols = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
        labels = np.array(self.index.groups, dtype=object)[cols["group"]]
        return pl.DataFrame(
            {
                "rank": labels[:, 2].astype(np.int64),
                "forward_ct": cols["open_fct"],
                "rid": cols["rid"].astype(str),
                "workload": labels[:, 0].astype(str),
                "mode": labels[:, 1].astype(str),
                "method": np.where(cols["greedy"], "greedy", "sampled"),
                "status": np.where(
                    cols["status"] == 2, "censored", np.where(cols["greedy"], "exact", "resolved")
                ),
                "window": cols["window"],
                "lo": cols["lo"],
                "point": cols["point"],
                "hi": cols["hi"],
                "var": cols["var"],
                "var_hi": cols["var_hi"],
                "resolved_at": cols["resolved_fct"],
                "point_lo": cols["point_lo"],
                "point_hi": cols["point_hi"],
                "unidentified": cols["unidentified"],
            }
        )

    def snapshot(self) -> EstimatorSnapshot:
        with self._lock:
            self._teach_population()
            # a block is either pending or counted: walks settled since the walker last
            # emitted are folded in now
            out = self.walker.emit_settled(self.extrapolation)
            if out or self._counts:
                self._fold(out)
            n = len(self.index.groups)
            walker = self.walker
            pending_groups = walker.blk[walker.blk_live, GROUP].astype(np.int64)
            pending = np.bincount(pending_groups, minlength=n)[:n].astype(np.float64)
            surv = np.full((n, self.gamma), np.nan)
            ident = np.zeros((n, self.gamma), dtype=bool)
            for g in range(n):
                surv[g], ident[g] = self.population.survival(g)
            return EstimatorSnapshot(
                self.gamma,
                list(self.index.groups),
                self.sums.total.copy(),
                self.sums.window(),
                pending,
                surv,
                ident,
                self.sums.window_steps,
            )
