"""Render a `Snapshot` of the aggregates (and ingest counters) as Prometheus text.

All arithmetic here is on fixed-size arrays already reduced by the aggregates;
the cost of a scrape is formatting, bounded by the number of series.
"""

from __future__ import annotations

import numpy as np

from ..aggregates import Snapshot
from ..aggregates.confidence import ECE_BINS
from ..aggregates.steps import COUNT_BUCKETS, QUANTITIES, quantity_histogram
from ..aggregates.tokens import histogram_slices
from ..estimator.online import COLUMNS as EST_COLUMNS
from ..estimator.online import EstimatorSnapshot
from ..sources.stats import IngestStats
from .catalog import BY_NAME, POS, REL, REQ, STEP
from .exposition import Writer, label_string


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


class Renderer:
    """Caches label strings per group so a steady scrape formats numbers only."""

    def __init__(self) -> None:
        self._labels: dict[tuple, list[str]] = {}

    def _cached(self, key: tuple, make) -> list[str]:
        if key not in self._labels:
            self._labels[key] = make()
        return self._labels[key]

    def _req_labels(self, snap: Snapshot, extra: tuple = ()) -> list[str]:
        key = ("req", len(snap.groups), extra)
        if key not in self._labels:
            self._labels[key] = [
                label_string((*REQ, *(n for n, _ in extra)), (*g, *(v for _, v in extra)))
                for g in snap.groups
            ]
        return self._labels[key]

    def _pos_labels(self, snap: Snapshot) -> list[str]:
        key = ("pos", len(snap.groups), snap.gamma)
        if key not in self._labels:
            self._labels[key] = [
                label_string(POS, (*g, j)) for g in snap.groups for j in range(snap.gamma)
            ]
        return self._labels[key]

    def _step_labels(self, snap: Snapshot) -> list[str]:
        key = ("step", len(snap.step_groups))
        if key not in self._labels:
            self._labels[key] = [label_string(STEP, g) for g in snap.step_groups]
        return self._labels[key]

    def render(
        self,
        snap: Snapshot,
        ingest: IngestStats | None = None,
        estimate: EstimatorSnapshot | None = None,
    ) -> bytes:
        w = Writer()
        window = snap.window_steps

        def head(name: str) -> str:
            m = BY_NAME[name]
            w.header(name, m.kind, m.help.format(window=window))
            return name

        if snap.groups:
            self._tokens(w, head, snap)
            self._confidence(w, head, snap)
        if snap.step_groups:
            self._steps(w, head, snap)
            self._cost(w, head, snap)
        if estimate is not None and estimate.groups:
            self._estimator(w, head, estimate)
        self._ingest(w, head, snap, ingest)
        return w.text()

    def _estimator(self, w: Writer, head, est: EstimatorSnapshot) -> None:
        labels = self._cached(
            ("est", tuple(est.groups)), lambda: [label_string(REQ, g) for g in est.groups]
        )

        def tagged(tag: str) -> list[str]:
            return self._cached(
                ("est", tuple(est.groups), tag),
                lambda: [label_string((*REQ, "source"), (*g, tag)) for g in est.groups],
            )

        tot, win = est.total, est.window
        col = {name: i for i, name in enumerate(EST_COLUMNS)}
        w.samples(
            head("dspark_estimator_trimmed_blocks_total"),
            labels,
            tot[:, col["trimmed_blocks"]].astype(np.int64),
        )
        w.samples(
            head("dspark_estimator_skipped_blocks_total"),
            labels,
            tot[:, col["skipped_blocks"]].astype(np.int64),
        )
        for metric, greedy, sampled in (
            ("dspark_estimator_resolved_blocks_total", "greedy_exact", "sampled_resolved"),
            ("dspark_estimator_censored_blocks_total", "greedy_censored", "sampled_censored"),
        ):
            head(metric)
            w.samples(metric, tagged("greedy"), tot[:, col[greedy]].astype(np.int64))
            w.samples(metric, tagged("sampled"), tot[:, col[sampled]].astype(np.int64))
        w.samples(head("dspark_estimator_pending_blocks"), labels, est.pending.astype(np.int64))

        def mean(table: np.ndarray, key: str) -> np.ndarray:
            walked = sum(
                table[:, col[k]]
                for k in ("greedy_exact", "greedy_censored", "sampled_resolved", "sampled_censored")
            )
            blocks = table[:, col["observed_blocks"]] + walked
            return _ratio(table[:, col["observed_sum"]] + table[:, col[key]], blocks)

        head("dspark_ceiling_estimate_tokens")
        w.samples("dspark_ceiling_estimate_tokens", tagged("walk"), mean(win, "point_sum"))
        w.samples(
            "dspark_ceiling_estimate_tokens", tagged("population"), np.nansum(est.survival, axis=1)
        )
        w.samples(head("dspark_ceiling_estimate_lower_tokens"), labels, mean(win, "lo_sum"))
        w.samples(head("dspark_ceiling_estimate_upper_tokens"), labels, mean(win, "hi_sum"))
        w.samples(head("dspark_ceiling_estimate_cumulative_tokens"), labels, mean(tot, "point_sum"))
        pos = self._cached(
            ("estpos", tuple(est.groups), est.gamma),
            lambda: [label_string(POS, (*g, j)) for g in est.groups for j in range(est.gamma)],
        )
        w.samples(head("dspark_population_survival_ratio"), pos, est.survival.ravel())
        w.samples(
            head("dspark_population_identifiable"), pos, est.identifiable.ravel().astype(np.int64)
        )

    def _tokens(self, w: Writer, head, snap: Snapshot) -> None:
        g = snap.gamma
        labels = self._req_labels(snap)
        total, win = snap.tokens["total"], snap.tokens["window"]
        offsets = histogram_slices(g)

        def hist(table, name):
            return table[:, offsets[name]]

        def weighted(h):
            return h @ np.arange(h.shape[1])

        rows = hist(total, "window").sum(axis=1)
        w.samples(head("dspark_request_steps_total"), labels, rows)
        for metric, name in (
            ("dspark_window_tokens", "window"),
            ("dspark_accepted_tokens", "accepted"),
            ("dspark_committed_tokens", "committed"),
        ):
            h = hist(total, name)
            counts = np.concatenate([h, np.zeros((len(h), 1), h.dtype)], axis=1)
            bounds = [str(v) for v in range(h.shape[1])] + ["+Inf"]
            w.histogram(head(metric), labels, bounds, counts, weighted(h))
        head("dspark_ceiling_tokens")
        for source in ("observed", "shadow"):
            h = hist(total, f"ceiling_{source}")
            present = h.sum(axis=1) > 0
            if present.any():
                lab = [
                    s
                    for s, p in zip(
                        self._req_labels(snap, (("source", source),)), present.tolist(), strict=True
                    )
                    if p
                ]
                counts = np.concatenate([h, np.zeros((len(h), 1), h.dtype)], axis=1)[present]
                bounds = [str(v) for v in range(g + 1)] + ["+Inf"]
                w.histogram("dspark_ceiling_tokens", lab, bounds, counts, weighted(h)[present])
        w.samples(
            head("dspark_trimmed_draft_tokens_total"),
            labels,
            (hist(total, "window") * (g - np.arange(g + 1))).sum(axis=1),
        )

        def known(table):
            ceiling = weighted(hist(table, "ceiling_observed")) + weighted(
                hist(table, "ceiling_shadow")
            )
            return (
                ceiling,
                weighted(hist(table, "accepted_known")),
                hist(table, "accepted_known").sum(axis=1),
            )

        ceil_t, acc_t, _ = known(total)
        w.samples(head("dspark_trim_loss_tokens_total"), labels, ceil_t - acc_t)
        ceil_w, acc_w, n_known_w = known(win)
        w.samples(head("dspark_utilisation_ratio"), labels, _ratio(acc_w, ceil_w))
        w.samples(head("dspark_utilisation_cumulative_ratio"), labels, _ratio(acc_t, ceil_t))
        n_w = hist(win, "window").sum(axis=1)
        w.samples(
            head("dspark_window_mean_tokens"), labels, _ratio(weighted(hist(win, "window")), n_w)
        )
        w.samples(
            head("dspark_accepted_mean_tokens"),
            labels,
            _ratio(weighted(hist(win, "accepted")), n_w),
        )
        w.samples(head("dspark_ceiling_mean_tokens"), labels, _ratio(ceil_w, n_known_w))

    def _confidence(self, w: Writer, head, snap: Snapshot) -> None:
        labels = self._pos_labels(snap)
        total, win = snap.confidence["total"], snap.confidence["window"]
        w.samples(head("dspark_confidence_labelled_total"), labels, total["count"].ravel())
        for metric, table, key in (
            ("dspark_confidence_ece", win, "ece"),
            ("dspark_confidence_ece_cumulative", total, "ece"),
            ("dspark_confidence_brier", win, "brier"),
            ("dspark_confidence_auroc", win, "auroc"),
            ("dspark_confidence_predicted_mean", win, "pred_mean"),
            ("dspark_confidence_observed_mean", win, "target_mean"),
        ):
            w.samples(head(metric), labels, table[key].ravel())
        # reliability summed over ranks: calibration is the model's, not the rank's, and the
        # bins are the bulk of the exposition (2 x 16 lines per workload, mode and position)
        keys = sorted({(wl, mode) for wl, mode, _ in snap.groups})
        of = np.array([keys.index((wl, mode)) for wl, mode, _ in snap.groups])
        rel = {
            k: np.stack([v[of == i].sum(axis=0) for i in range(len(keys))])
            for k, v in snap.reliability.items()
        }
        rel_labels = self._cached(
            ("rel", tuple(keys), snap.gamma),
            lambda: [label_string(REL, (*k, j)) for k in keys for j in range(snap.gamma)],
        )
        bounds = [f"{(k + 1) / ECE_BINS:.6g}" for k in range(ECE_BINS - 1)] + ["+Inf"]
        rows = rel["rows"].reshape(-1, ECE_BINS)
        keep = rows.sum(axis=1) > 0
        lab = [s for s, k in zip(rel_labels, keep.tolist(), strict=True) if k]
        for metric, count_key, sum_key in (
            ("dspark_confidence_survival", "rows", "pred_sum"),
            ("dspark_confidence_accepted_survival", "positives", "positive_pred_sum"),
        ):
            w.histogram(
                head(metric),
                lab,
                bounds,
                rel[count_key].reshape(-1, ECE_BINS)[keep],
                rel[sum_key].reshape(-1, ECE_BINS).sum(axis=1)[keep],
            )

    def _steps(self, w: Writer, head, snap: Snapshot) -> None:
        labels = self._step_labels(snap)
        total = snap.steps["total"]
        w.samples(head("dspark_steps_total"), labels, total[:, 0].astype(np.int64))
        bounds = [str(b) for b in COUNT_BUCKETS] + ["+Inf"]
        for q, metric in zip(
            QUANTITIES,
            (
                "dspark_batch_size",
                "dspark_budget_tokens",
                "dspark_verify_tokens",
                "dspark_graph_tier_tokens",
            ),
            strict=True,
        ):
            counts, sums = quantity_histogram(total, q)
            head(metric)
            present = counts.sum(axis=1) > 0
            if present.any():
                lab = [s for s, p in zip(labels, present.tolist(), strict=True) if p]
                w.histogram(metric, lab, bounds, counts[present], sums[present])

    def _cost(self, w: Writer, head, snap: Snapshot) -> None:
        labels = self._step_labels(snap)
        tot, win = snap.cost["total"], snap.cost["window"]
        n = tot["steps"]
        w.samples(head("dspark_cost_model_steps_total"), labels, n.astype(np.int64))
        with np.errstate(invalid="ignore"):
            w.samples(
                head("dspark_step_predicted_seconds_total"),
                labels,
                np.nan_to_num(tot["predicted_mean"] * n),
            )
            w.samples(
                head("dspark_step_measured_seconds_total"),
                labels,
                np.nan_to_num(tot["measured_mean"] * n),
            )
            w.samples(
                head("dspark_cost_model_abs_error_seconds_total"),
                labels,
                np.nan_to_num(tot["abs_error_mean"] * n),
            )
        for metric, key in (
            ("dspark_step_predicted_seconds", "predicted_mean"),
            ("dspark_step_measured_seconds", "measured_mean"),
            ("dspark_cost_model_abs_error_seconds", "abs_error_mean"),
            ("dspark_cost_model_bias_seconds", "bias"),
            ("dspark_cost_model_relative_error_ratio", "rel_error_median"),
        ):
            w.samples(head(metric), labels, win[key])
        refits = snap.refits + [None] * (len(labels) - len(snap.refits))
        for metric, attr in (
            ("dspark_cost_model_refit_r2", "r2"),
            ("dspark_cost_model_refit_rms_seconds", "rms_seconds"),
            ("dspark_cost_model_refit_steps", "steps"),
        ):
            w.samples(
                head(metric),
                labels,
                np.array(
                    [
                        np.nan if r is None else float(getattr(r, attr))
                        for r in refits[: len(labels)]
                    ]
                ),
            )

    def _ingest(self, w: Writer, head, snap: Snapshot, ingest: IngestStats | None) -> None:
        if ingest is not None:
            records, errors, up = ingest.snapshot()
            w.samples(
                head("dspark_ingest_records_total"),
                [label_string(("source",), (s,)) for s in records],
                np.array(list(records.values()), dtype=np.int64),
            )
            w.samples(
                head("dspark_ingest_errors_total"),
                [label_string(("source", "reason"), k) for k in errors],
                np.array(list(errors.values()), dtype=np.int64),
            )
            w.samples(
                head("dspark_source_up"),
                [label_string(("source",), (s,)) for s in up],
                np.array(list(up.values()), dtype=np.int64),
            )
        w.samples(
            head("dspark_workload_overflow_total"),
            [""],
            np.array([snap.overflow_rows], dtype=np.int64),
        )
