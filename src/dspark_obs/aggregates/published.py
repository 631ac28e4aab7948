"""What the live aggregates publish: one typed section per concern, in the series model.

Each section reads the aggregates' own tables of one snapshot and offers every
published quantity as an attribute (`dspark_obs.series` parts): counts, means,
ratios and histograms per label group. Quantities are computed when first read,
so a scrape pays only for what it publishes. The table layouts (histogram
columns, calibration bins, cost columns) stay in this package.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from ..domain.step_cost import CONTEXT_BUCKETS, Refit
from ..series import Buckets, Exemplars, Labels, Samples, ratio
from .confidence import ECE_BINS
from .cost_model import CONTEXT_COLUMNS
from .steps import COUNT_BUCKETS, quantity_histogram
from .tokens import histogram_slices

REQUEST = ("workload", "mode", "rank")
POSITION = (*REQUEST, "position")
STEP = ("mode", "rank")
STEP_CONTEXT = (*STEP, "context")
RELIABILITY = ("workload", "mode", "position")


class RequestLabels:
    """Label tables of one list of request groups `(workload, mode, rank)`, built once."""

    def __init__(self, groups: tuple[tuple[str, str, int], ...], gamma: int) -> None:
        self.groups = groups
        self.gamma = gamma
        self._tagged: dict[str, Labels] = {}
        self._binned: dict[int, Labels] = {}

    @cached_property
    def request(self) -> Labels:
        return Labels(REQUEST, self.groups)

    def tagged(self, source: str) -> Labels:
        """The request labels with `source=<source>` last."""
        labels = self._tagged.get(source)
        if labels is None:
            labels = self._tagged[source] = Labels(
                (*REQUEST, "source"), [(*g, source) for g in self.groups]
            )
        return labels

    @cached_property
    def position(self) -> Labels:
        return Labels(POSITION, [(*g, j) for g in self.groups for j in range(self.gamma)])

    def binned(self, bins: int) -> Labels:
        """The position labels with `bin=0..bins-1` last."""
        labels = self._binned.get(bins)
        if labels is None:
            labels = self._binned[bins] = Labels(
                (*POSITION, "bin"),
                [(*g, j, b) for g in self.groups for j in range(self.gamma) for b in range(bins)],
            )
        return labels

    @cached_property
    def model_keys(self) -> list[tuple[str, str]]:
        """The (workload, mode) pairs, sorted: calibration is the model's, not the rank's."""
        return sorted({(wl, mode) for wl, mode, _ in self.groups})

    @cached_property
    def model_of(self) -> np.ndarray:
        """Index into `model_keys` of each group."""
        at = {k: i for i, k in enumerate(self.model_keys)}
        return np.array([at[(wl, mode)] for wl, mode, _ in self.groups])

    @cached_property
    def model_position(self) -> Labels:
        return Labels(RELIABILITY, [(*k, j) for k in self.model_keys for j in range(self.gamma)])

    @cached_property
    def model_binned(self) -> Labels:
        """The (workload, mode, position) labels with `bin=0..14` (the ECE bins) last."""
        rows = [(*k, j) for k in self.model_keys for j in range(self.gamma)]
        return Labels((*RELIABILITY, "bin"), [(*r, b) for r in rows for b in range(ECE_BINS)])


@lru_cache(maxsize=16)
def request_labels(groups: tuple[tuple[str, str, int], ...], gamma: int) -> RequestLabels:
    """Shared per list of groups: the groups only grow, so a steady scrape reuses one."""
    return RequestLabels(groups, gamma)


@lru_cache(maxsize=16)
def context_labels(step_groups: tuple[tuple[str, int], ...]) -> Labels:
    """Every (mode, rank, context bucket), buckets by their lower bound in tokens."""
    return Labels(STEP_CONTEXT, [(*g, lo) for g in step_groups for lo in CONTEXT_BUCKETS])


@lru_cache(maxsize=16)
def step_labels(step_groups: tuple[tuple[str, int], ...]) -> Labels:
    return Labels(STEP, step_groups)


def _weighted(h: np.ndarray) -> np.ndarray:
    """Sum of the values of an integer histogram over 0..n (one per row)."""
    return h @ np.arange(h.shape[1])


def _with_overflow(h: np.ndarray) -> np.ndarray:
    """Integer histogram over 0..n as bucket counts: nothing above its last value."""
    return np.concatenate([h, np.zeros((len(h), 1), h.dtype)], axis=1)


@dataclass(eq=False)
class TokenSeries:
    """Tokens per request-step, per request group: cumulative and over the window."""

    labels: RequestLabels
    gamma: int
    window_steps: int
    total: np.ndarray  # TokenAggregate rows, since start
    window: np.ndarray  # the same, over the window
    #: `exemplars.RecentObservations.copy()` (empty: none kept)
    exemplars: dict = field(default_factory=dict)

    @cached_property
    def _slices(self) -> dict[str, slice]:
        return histogram_slices(self.gamma)

    def _hist(self, table: np.ndarray, name: str) -> np.ndarray:
        return table[:, self._slices[name]]

    def _distribution(self, name: str) -> Buckets:
        h = self._hist(self.total, name)
        return Buckets(
            self.labels.request, tuple(range(h.shape[1])), _with_overflow(h), _weighted(h),
            exemplars=self._exemplars(name, h.shape[1] + 1),
        )  # fmt: skip

    def _exemplars(self, name: str, buckets: int) -> Exemplars | None:
        """The recent request-step of each bucket (integer buckets: its value is the bucket's)."""
        if name not in self.exemplars:
            return None
        rid, step, when = (a[: len(self.labels.groups), :buckets] for a in self.exemplars[name])
        observed = np.broadcast_to(np.arange(buckets, dtype=np.float64), rid.shape)
        steps = np.where(step >= 0, step.astype(str).astype(object), None)
        return Exemplars(("rid", "step"), (rid, steps), observed, when)

    def _known(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ceiling and accepted sums, and request-steps, where the ceiling is known."""
        ceiling = _weighted(self._hist(table, "ceiling_observed")) + _weighted(
            self._hist(table, "ceiling_shadow")
        )
        known = self._hist(table, "accepted_known")
        return ceiling, _weighted(known), known.sum(axis=1)

    @cached_property
    def _known_total(self):
        return self._known(self.total)

    @cached_property
    def _known_window(self):
        return self._known(self.window)

    @property
    def request_steps(self) -> Samples:
        return Samples(self.labels.request, self._hist(self.total, "window").sum(axis=1))

    @property
    def window_tokens(self) -> Buckets:
        return self._distribution("window")

    @property
    def accepted_tokens(self) -> Buckets:
        return self._distribution("accepted")

    @property
    def committed_tokens(self) -> Buckets:
        return self._distribution("committed")

    @property
    def ceiling_tokens(self) -> tuple[Buckets, ...]:
        """Observed and shadow ceilings, each over the groups that have one."""
        parts = []
        for source in ("observed", "shadow"):
            h = self._hist(self.total, f"ceiling_{source}")
            parts.append(
                Buckets(
                    self.labels.tagged(source),
                    tuple(range(self.gamma + 1)),
                    _with_overflow(h),
                    _weighted(h),
                    keep=h.sum(axis=1) > 0,
                )
            )
        return tuple(parts)

    @property
    def trimmed_draft_tokens(self) -> Samples:
        g = self.gamma
        trimmed = (self._hist(self.total, "window") * (g - np.arange(g + 1))).sum(axis=1)
        return Samples(self.labels.request, trimmed)

    @property
    def trim_loss_tokens(self) -> Samples:
        ceiling, accepted, _ = self._known_total
        return Samples(self.labels.request, ceiling - accepted)

    @property
    def utilisation(self) -> Samples:
        ceiling, accepted, _ = self._known_window
        return Samples(self.labels.request, ratio(accepted, ceiling))

    @property
    def utilisation_cumulative(self) -> Samples:
        ceiling, accepted, _ = self._known_total
        return Samples(self.labels.request, ratio(accepted, ceiling))

    @cached_property
    def _window_steps_seen(self) -> np.ndarray:
        return self._hist(self.window, "window").sum(axis=1)

    @property
    def window_mean(self) -> Samples:
        verified = _weighted(self._hist(self.window, "window"))
        return Samples(self.labels.request, ratio(verified, self._window_steps_seen))

    @property
    def accepted_mean(self) -> Samples:
        accepted = _weighted(self._hist(self.window, "accepted"))
        return Samples(self.labels.request, ratio(accepted, self._window_steps_seen))

    @property
    def ceiling_mean(self) -> Samples:
        ceiling, _, known = self._known_window
        return Samples(self.labels.request, ratio(ceiling, known))


#: Upper bounds of the calibration histograms: the ECE bins' right edges (+Inf last).
RELIABILITY_BOUNDS = tuple((k + 1) / ECE_BINS for k in range(ECE_BINS - 1))


@dataclass(eq=False)
class ConfidenceSeries:
    """Calibration of the survival predictions per request group and block position."""

    labels: RequestLabels
    window_steps: int
    total: dict[str, np.ndarray]  # `ConfidenceAggregate.metrics` since start
    window: dict[str, np.ndarray]  # and over the window
    reliability_by_group: dict[str, np.ndarray]  # `ConfidenceAggregate.reliability`, since start

    def _position(self, values: np.ndarray) -> Samples:
        return Samples(self.labels.position, values.ravel())

    @property
    def labelled(self) -> Samples:
        return self._position(self.total["count"])

    @property
    def ece(self) -> Samples:
        return self._position(self.window["ece"])

    @property
    def ece_cumulative(self) -> Samples:
        return self._position(self.total["ece"])

    @property
    def brier(self) -> Samples:
        return self._position(self.window["brier"])

    @property
    def auroc(self) -> Samples:
        return self._position(self.window["auroc"])

    @property
    def predicted_mean(self) -> Samples:
        return self._position(self.window["pred_mean"])

    @property
    def observed_mean(self) -> Samples:
        return self._position(self.window["target_mean"])

    @cached_property
    def _reliability(self) -> dict[str, np.ndarray]:
        """Summed over ranks, `[(workload, mode) x position, ECE_BINS]`: calibration is the
        model's, not the rank's, and the bins are the bulk of the exposition (the series
        budget in docs/metrics.md). With them, the rows rejected in lower bins, which a
        merged AUROC needs (PromQL cannot sum over bins below a label's value)."""
        of = self.labels.model_of
        n = len(self.labels.model_keys)
        out = {
            k: np.stack(
                [self.reliability_by_group[k][of == i].sum(axis=0) for i in range(n)]
            ).reshape(-1, ECE_BINS)
            for k in ("rows", "positives", "pred_sum", "positive_pred_sum")
        }
        negatives = out["rows"] - out["positives"]
        out["negatives_below"] = np.cumsum(negatives, axis=1) - negatives
        return out

    @cached_property
    def _labelled(self) -> np.ndarray:
        """The (workload, mode, position) series with labelled rows: both histograms keep
        the same series."""
        return self._reliability["rows"].sum(axis=1) > 0

    def _bins(self, count_key: str, sum_key: str) -> Buckets:
        rel = self._reliability
        return Buckets(
            self.labels.model_position,
            RELIABILITY_BOUNDS,
            rel[count_key],
            rel[sum_key].sum(axis=1),
            keep=self._labelled,
        )

    @property
    def survival(self) -> Buckets:
        return self._bins("rows", "pred_sum")

    @property
    def accepted_survival(self) -> Buckets:
        return self._bins("positives", "positive_pred_sum")

    # The sufficient statistics, since start: counters whose sums over any set of series give
    # that set's ECE, Brier and AUROC exactly (deploy/rules/fleet.yml). The bins are per
    # (workload, mode, position), summed over ranks; Brier's per (workload, mode, rank,
    # position); the finer AUROC bins per rank too (`--detail-metrics`). Positions without
    # a labelled row publish nothing.

    @cached_property
    def _labelled_positions(self) -> np.ndarray:
        return self.reliability_by_group["rows"].sum(axis=-1).ravel() > 0

    def _per_position(self, key: str) -> Samples:
        values = self.reliability_by_group[key].astype(np.float64).ravel()
        return Samples(self.labels.position, np.where(self._labelled_positions, values, np.nan))

    def _per_bin(self, key: str) -> Samples:
        table = self.reliability_by_group[key]
        bins = table.shape[-1]
        keep = np.repeat(self._labelled_positions, bins)
        values = np.where(keep, table.astype(np.float64).ravel(), np.nan)
        return Samples(self.labels.binned(bins), values)

    def _per_model_bin(self, key: str) -> Samples:
        keep = np.repeat(self._labelled, ECE_BINS)
        values = np.where(keep, self._reliability[key].astype(np.float64).ravel(), np.nan)
        return Samples(self.labels.model_binned, values)

    @property
    def bin_rows(self) -> Samples:
        return self._per_model_bin("rows")

    @property
    def bin_positives(self) -> Samples:
        return self._per_model_bin("positives")

    @property
    def bin_predicted(self) -> Samples:
        return self._per_model_bin("pred_sum")

    @property
    def bin_negatives_below(self) -> Samples:
        return self._per_model_bin("negatives_below")

    @property
    def positive_predicted(self) -> Samples:
        return Samples(
            self.labels.position,
            np.where(
                self._labelled_positions,
                self.reliability_by_group["positive_pred_sum"].sum(axis=-1).ravel(),
                np.nan,
            ),
        )

    @property
    def predicted_squared(self) -> Samples:
        return self._per_position("pred_squared_sum")

    @property
    def positives(self) -> Samples:
        return Samples(
            self.labels.position,
            np.where(
                self._labelled_positions,
                self.reliability_by_group["positives"].sum(axis=-1).ravel(),
                np.nan,
            ),
        )

    @property
    def auroc_positives(self) -> Samples:
        return self._per_bin("auroc_positives")

    @property
    def auroc_negatives(self) -> Samples:
        return self._per_bin("auroc_negatives")

    @property
    def auroc_negatives_below(self) -> Samples:
        return self._per_bin("auroc_negatives_below")


@dataclass(eq=False)
class StepSeries:
    """Load per verify step, per step group (mode, rank)."""

    labels: Labels
    window_steps: int
    total: np.ndarray  # StepAggregate rows, since start

    @property
    def steps(self) -> Samples:
        return Samples(self.labels, self.total[:, 0].astype(np.int64))

    def _quantity(self, name: str) -> Buckets:
        counts, sums = quantity_histogram(self.total, name)
        return Buckets(
            self.labels, tuple(COUNT_BUCKETS.tolist()), counts, sums, keep=counts.sum(axis=1) > 0
        )

    @property
    def batch_size(self) -> Buckets:
        return self._quantity("batch_size")

    @property
    def budget_tokens(self) -> Buckets:
        return self._quantity("budget")

    @property
    def verify_tokens(self) -> Buckets:
        return self._quantity("verify_tokens")

    @property
    def graph_tier_tokens(self) -> Buckets:
        return self._quantity("graph_tier")


@dataclass(eq=False)
class CostSeries:
    """The step-cost table against measured step times, per step group (mode, rank)."""

    labels: Labels
    window_steps: int
    total: dict[str, np.ndarray]  # `CostModelAggregate.error_metrics` since start
    window: dict[str, np.ndarray]  # and over the window
    refits: list[Refit | None]  # per step group (those not yet seen: none)
    context_labels: Labels  # (mode, rank, context) per step group and context bucket
    by_context: np.ndarray  # `CostModelAggregate.by_context`: [group, bucket, column] sums

    def _context_sum(self, column: str) -> Samples:
        """One column of the by-context sums per (mode, rank, context); buckets no step
        reached publish no sample."""
        table = self.by_context[: len(self.labels)].reshape(-1, len(CONTEXT_COLUMNS))
        steps = table[:, 0]
        value = table[:, CONTEXT_COLUMNS.index(column)]
        return Samples(self.context_labels, np.where(steps > 0, value, np.nan))

    @property
    def context_steps(self) -> Samples:
        return self._context_sum("n")

    @property
    def context_predicted_seconds(self) -> Samples:
        return self._context_sum("predicted")

    @property
    def context_measured_seconds(self) -> Samples:
        return self._context_sum("measured")

    @property
    def context_squared_error(self) -> Samples:
        return self._context_sum("sq_error")

    @property
    def context_relative_error(self) -> Samples:
        return self._context_sum("rel_error")

    @property
    def context_tokens(self) -> Samples:
        return self._context_sum("context")

    @property
    def steps(self) -> Samples:
        return Samples(self.labels, self.total["steps"].astype(np.int64))

    def _sum(self, mean_key: str) -> Samples:
        with np.errstate(invalid="ignore"):
            return Samples(self.labels, np.nan_to_num(self.total[mean_key] * self.total["steps"]))

    @property
    def predicted_seconds_total(self) -> Samples:
        return self._sum("predicted_mean")

    @property
    def measured_seconds_total(self) -> Samples:
        return self._sum("measured_mean")

    @property
    def abs_error_seconds_total(self) -> Samples:
        return self._sum("abs_error_mean")

    @property
    def predicted_seconds(self) -> Samples:
        return Samples(self.labels, self.window["predicted_mean"])

    @property
    def measured_seconds(self) -> Samples:
        return Samples(self.labels, self.window["measured_mean"])

    @property
    def abs_error_seconds(self) -> Samples:
        return Samples(self.labels, self.window["abs_error_mean"])

    @property
    def bias_seconds(self) -> Samples:
        return Samples(self.labels, self.window["bias"])

    @property
    def relative_error(self) -> Samples:
        return Samples(self.labels, self.window["rel_error_median"])

    def _refit(self, attr: str) -> Samples:
        n = len(self.labels)
        refits = (self.refits + [None] * (n - len(self.refits)))[:n]
        values = np.array([np.nan if r is None else float(getattr(r, attr)) for r in refits])
        return Samples(self.labels, values)

    @property
    def refit_r2(self) -> Samples:
        return self._refit("r2")

    @property
    def refit_rms_seconds(self) -> Samples:
        return self._refit("rms_seconds")

    @property
    def refit_steps(self) -> Samples:
        return self._refit("steps")


_NO_LABELS = Labels((), [()])


@dataclass(eq=False)
class WorkloadSeries:
    """The workload cap at work: request-steps counted under `other`."""

    overflow_rows: int

    @property
    def overflow(self) -> Samples:
        return Samples(_NO_LABELS, np.array([self.overflow_rows], dtype=np.int64))
