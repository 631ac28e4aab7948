"""The cost of trimming, live: what each group committed and what static would have.

The post-hoc headline (`whatif/trim_cost.py`) compares the run's tokens/s `C_o / T_o`
with static's `C_s / T_s` on the same request-steps. Published as ratios per process
those could not be merged across ranks or nodes, so the estimator keeps the sums
instead, per (workload, mode, rank) group, since start and over its window:

- `trim_committed`: committed tokens, `C_o` (accepted drafts + the bonus);
- `trim_seconds`: each request-step's share of its step's time (`T / bs`), `T_o`;
- `trim_static_seconds`: the same share of the step's time at static's verify tier, `T_s`;
- `trim_static_lo|point|hi`: what static would have committed, `C_s` with its bracket.

Any set of series and window then gives the net exactly as sums of sums (the fleet
rules). A step is priced as `whatif` prices it (`domain.cost_table.repriced_seconds`:
its measured time scaled by the cost table between its recorded tier and the tier of
`bs * (gamma + 1)` tokens, the table's own time where untimed), with the table it is
given (the server's) or else the aggregates' online refit of its (mode, rank); steps
before a first refit count in none of the sums. Static's accepted drafts are the
ceiling: exact where the step was not trimmed or the mode reveals it (static,
cap-accept); the walk's lo / point / hi for a walked tail, which counts as (window,
window, gamma) from its step until its walk ends (an open walk keeps the bracket true
and the point low by its tail; since start, once the walks close, the sums are
exact); for a trimmed tail no walk can follow,
the window, the population model's expectation and gamma. A cap-accept shadow twin's
ceilings are not read live (its post-hoc equal is `trim_cost(run, use_shadow=False)`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dspark_obs.aggregates.published import RequestLabels
from dspark_obs.domain.cost_table import DEFAULT_CAPTURE_TIERS, repriced_seconds
from dspark_obs.domain.step_cost import MAX_STEP_S, MIN_STEP_S
from dspark_obs.series import Samples, ratio
from dspark_obs.telemetry import StepBatch
from dspark_obs.telemetry.batch import MODE_CAP_ACCEPT, MODE_CODE, MODE_STATIC, ceiling_rule

from . import compiled
from .population import HazardModel, tail_terms

#: The estimator's columns this fold writes, in order.
TRIM_COLUMNS = (
    "trim_committed",
    "trim_seconds",
    "trim_static_seconds",
    "trim_static_lo",
    "trim_static_point",
    "trim_static_hi",
)

#: A step's cost table by (mode, rank); None while there is none to price with.
StepCost = Callable[[str, int], object | None]


class TrimCostFold:
    """Queues steps as the estimator takes them and folds them in with its counts."""

    def __init__(
        self, gamma: int, step_cost: StepCost, tiers: tuple[int, ...] = DEFAULT_CAPTURE_TIERS
    ) -> None:
        self.gamma = gamma
        self.step_cost = step_cost
        self.tiers = tuple(tiers)
        self._steps: list[tuple[StepBatch, np.ndarray, np.ndarray, np.ndarray]] = []
        # per group: the first forward_ct priced (walks opened before it count nowhere), and
        # whether its mode censors the ceiling (only then does a walk speak for static)
        self._priced_from = np.zeros(0)
        self._censors = np.zeros(0, dtype=bool)

    def queue(
        self, batch: StepBatch, group: np.ndarray, window: np.ndarray, opened: np.ndarray
    ) -> None:
        """One step's rows, their groups, windows (`batch.window`, which the caller has
        already derived) and which of them opened a walk."""
        self._steps.append((batch, group, window, opened))

    def ensure_groups(self, groups: list[tuple[str, str, int]]) -> None:
        grow = len(groups) - len(self._priced_from)
        if grow > 0:
            self._priced_from = np.append(self._priced_from, np.full(grow, np.inf))
            self._censors = np.array(
                [
                    MODE_CODE.get(mode, 1) not in (MODE_STATIC, MODE_CAP_ACCEPT)
                    for _, mode, _ in groups
                ]
            )

    def fold(
        self, delta: np.ndarray, col: dict[str, int], outcomes: dict, population: HazardModel
    ) -> None:
        """Add the queued steps and the walks' outcomes to `delta` (`[columns, groups]`)."""
        steps, self._steps = self._steps, []
        if steps:
            self._fold_steps(steps, delta, col, population)
        if outcomes:
            g = outcomes["group"]
            keep = self._censors[g] & (outcomes["open_fct"] >= self._priced_from[g])
            n, g, w = delta.shape[1], g[keep], outcomes["window"][keep]
            # the row counted [w, w, gamma] when it opened: the walk replaces that
            for bound, opened_as in (("lo", w), ("point", w), ("hi", self.gamma)):
                delta[col[f"trim_static_{bound}"]] += np.bincount(
                    g, outcomes[bound][keep] - opened_as, n
                )

    def _step_seconds(self, steps, nreq: np.ndarray, wsum: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per step: own and static seconds (NaN where no table prices the step)."""
        scalars = np.array(
            [
                (
                    b.step_gpu_ms if b.step_gpu_ms is not None else b.step_cpu_ms,
                    b.num_verify_tokens if b.num_verify_tokens >= 0 else b.verify_tokens_local,
                )
                for b, *_ in steps
            ],
            dtype=np.float64,
        ).reshape(-1, 2)
        measured = scalars[:, 0] / 1e3
        measured[~((measured >= MIN_STEP_S) & (measured <= MAX_STEP_S))] = np.nan
        recorded = np.where(scalars[:, 1] >= 0, scalars[:, 1], np.nan)
        own, static = np.full(len(steps), np.nan), np.full(len(steps), np.nan)
        keys = [(b.mode, b.rank) for b, *_ in steps]
        for key in set(keys):
            table = self.step_cost(*key)
            if table is None:
                continue
            sel = np.fromiter((k == key for k in keys), bool, len(keys))
            args = (nreq[sel], recorded[sel], measured[sel], self.tiers)
            own[sel] = repriced_seconds(table, args[0], args[0] + wsum[sel], *args[1:])
            static[sel] = repriced_seconds(table, args[0], args[0] * (self.gamma + 1), *args[1:])
        return own, static

    def _fold_compiled(self, kernels, steps, delta, col) -> bool:
        """`_fold_steps` in one compiled pass over the steps' rows; False (nothing done)
        where a priced trimmed row opened no walk, whose tail the numpy form prices."""
        nreq = np.array([len(g) for _, g, *_ in steps])
        own, static = self._step_seconds(steps, nreq, kernels.window_sums(steps, 2))
        priced = np.isfinite(own)
        if not priced.any():
            return True
        modes = np.array([MODE_CODE[b.mode] for b, *_ in steps], np.int8)
        fct = np.array([b.forward_ct for b, *_ in steps], np.int64)
        got = kernels.trim_rows(
            steps, self.gamma, delta.shape[1], own / nreq, static / nreq, priced, modes, fct
        )
        if got is None:
            return False
        sums, first = got
        fresh = np.isinf(self._priced_from)
        self._priced_from[fresh] = first[fresh]
        for name, values in zip(TRIM_COLUMNS, sums, strict=True):
            delta[col[name]] += values
        return True

    def _fold_steps(self, steps, delta, col, population: HazardModel) -> None:
        kernels = compiled.KERNELS
        if kernels is not None and self._fold_compiled(kernels, steps, delta, col):
            return
        nreq = np.array([len(g) for _, g, *_ in steps])
        group = np.concatenate([g for _, g, *_ in steps])
        w = np.concatenate([w for _, _, w, _ in steps])
        a = np.concatenate([b.accepted for b, *_ in steps])
        start = np.cumsum(nreq) - nreq
        own, static = self._step_seconds(steps, nreq, np.add.reduceat(w, start))
        step_priced = np.isfinite(own)
        if not step_priced.any():
            return
        priced = np.repeat(step_priced, nreq)
        # every step priced (the common case): whole arrays, not boolean-indexed copies
        rows = slice(None) if step_priced.all() else priced
        fct = np.repeat([b.forward_ct for b, *_ in steps], nreq)
        fresh = priced & np.isinf(self._priced_from[group])
        if fresh.any():
            np.minimum.at(self._priced_from, group[fresh], fct[fresh])
        modes = [MODE_CODE[b.mode] for b, *_ in steps]
        # one code for every row where the steps agree (ceiling_rule takes either)
        mode = modes[0] if len(set(modes)) == 1 else np.repeat(modes, nreq)
        known = ceiling_rule(mode, a, np.concatenate([b.cap_trim for b, *_ in steps]))
        untrimmed = (a < w) | (w >= self.gamma)
        exact = np.where(known >= 0, known, np.where(untrimmed, a, -1)).astype(np.float64)
        lo, point, hi = exact.copy(), exact.copy(), exact.copy()
        opened = np.concatenate([o for *_, o in steps])
        # a walked tail counts as [window, window, gamma] until its walk ends; one no walk
        # follows takes the window, the population model's expectation and gamma
        walked = np.flatnonzero((exact < 0) & opened)
        lo[walked] = point[walked] = w[walked]
        hi[walked] = self.gamma
        modelled = np.flatnonzero((exact < 0) & ~opened & priced)
        if len(modelled):
            conf = self._confidence(steps, nreq, modelled)
            rates = population.acceptance(group[modelled], conf)[0]
            wm = w[modelled]
            lo[modelled], hi[modelled] = wm, self.gamma
            point[modelled] = wm + tail_terms(rates, wm)[1]
        n = delta.shape[1]
        g = group[rows]
        delta[col["trim_committed"]] += np.bincount(g, a[rows] + 1, n)
        delta[col["trim_seconds"]] += np.bincount(g, np.repeat(own / nreq, nreq)[rows], n)
        delta[col["trim_static_seconds"]] += np.bincount(g, np.repeat(static / nreq, nreq)[rows], n)
        bonus = np.bincount(g, minlength=n)  # static commits a bonus token on every row too
        for name, values in (("lo", lo), ("point", point), ("hi", hi)):
            delta[col[f"trim_static_{name}"]] += bonus + np.bincount(g, values[rows], n)

    def _confidence(self, steps, nreq: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
        """`[len(rows), gamma]` confidences of `rows` (NaN where a step has none)."""
        mats = [b.confidence for b, *_ in steps]
        if all(m is None for m in mats):
            return None
        full = np.concatenate(
            [
                m if m is not None else np.full((k, self.gamma), np.nan)
                for m, k in zip(mats, nreq, strict=True)
            ]
        )
        return full[rows]


@dataclass(eq=False)
class TrimCostSeries:
    """The cost of trimming per request group: the sums as counters (mergeable), and the
    net over the estimator's window as gauges (one process's convenience)."""

    labels: RequestLabels
    total: np.ndarray  # [groups, columns] since start
    window: np.ndarray
    col: dict[str, int]
    window_steps: int

    def _total(self, name: str) -> Samples:
        return Samples(self.labels.request, self.total[:, self.col[name]])

    @property
    def committed_tokens(self) -> Samples:
        return self._total("trim_committed")

    @property
    def seconds(self) -> Samples:
        return self._total("trim_seconds")

    @property
    def static_seconds(self) -> Samples:
        return self._total("trim_static_seconds")

    @property
    def static_committed_tokens(self) -> Samples:
        return self._total("trim_static_point")

    @property
    def static_committed_lower_tokens(self) -> Samples:
        return self._total("trim_static_lo")

    @property
    def static_committed_upper_tokens(self) -> Samples:
        return self._total("trim_static_hi")

    def _w(self, name: str) -> np.ndarray:
        return self.window[:, self.col[name]]

    def _rate(self, tokens: str, seconds: str) -> np.ndarray:
        return ratio(self._w(tokens), self._w(seconds))

    def _net(self, static: str) -> Samples:
        own = self._rate("trim_committed", "trim_seconds")
        return Samples(self.labels.request, own - self._rate(static, "trim_static_seconds"))

    @property
    def net(self) -> Samples:
        return self._net("trim_static_point")

    @property
    def net_lower(self) -> Samples:
        return self._net("trim_static_hi")

    @property
    def net_upper(self) -> Samples:
        return self._net("trim_static_lo")

    @property
    def step_time_saved(self) -> Samples:
        own = self._rate("trim_committed", "trim_seconds")
        return Samples(
            self.labels.request, own - self._rate("trim_committed", "trim_static_seconds")
        )

    @property
    def accepted_lost(self) -> Samples:
        lost = self._w("trim_committed") - self._w("trim_static_point")
        return Samples(self.labels.request, ratio(lost, self._w("trim_static_seconds")))
