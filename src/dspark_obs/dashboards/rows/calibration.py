"""The calibration row: does the drafter's predicted survival match what was accepted?

The reliability bars read bucket differences of two histograms whose bounds must match the
exporter's bins exactly, so their queries are generated from the same bin count.
"""

from __future__ import annotations

from ...aggregates.confidence import ECE_BINS
from ..panels import AUROC, BLUE, BRIER, ECE, bar_gauge, threshold_steps, timeseries
from ..promql import REL, REQ


def _reliability_queries() -> list[tuple[str, str]]:
    """Observed acceptance per predicted-survival bin: bucket differences of the two histograms.

    The buckets are cumulative, so bin k is bucket(le=hi) - bucket(le=lo); the bounds are
    formatted exactly as the exporter writes them.
    """
    bounds = [f"{(k + 1) / ECE_BINS:.6g}" for k in range(ECE_BINS - 1)] + ["+Inf"]
    out = []
    for k, hi in enumerate(bounds):
        lo = bounds[k - 1] if k else None

        def bucket(name: str, le: str) -> str:
            return f'sum({name}{{{REL}, le="{le}"}})'

        num = bucket("dspark_confidence_accepted_survival_bucket", hi)
        den = bucket("dspark_confidence_survival_bucket", hi)
        if lo is not None:
            num = f"({num} - {bucket('dspark_confidence_accepted_survival_bucket', lo)})"
            den = f"({den} - {bucket('dspark_confidence_survival_bucket', lo)})"
        out.append((f"{num} / {den}", f"{k / ECE_BINS:.2f}-{(k + 1) / ECE_BINS:.2f}"))
    return out


def panels() -> list:
    by_pos = "{{position}}"
    return [
        timeseries(
            "ECE by position",
            "Expected calibration error of predicted survival at each draft position over the "
            "last N steps (15 equal-width bins), averaged over the selected series.",
            "percentunit",
            [(f"avg by (position) (dspark_confidence_ece{{{REQ}}})", "position " + by_pos)],
            thresholds=ECE,
            w=8,
            min_val=0,
        ),
        timeseries(
            "Brier score by position",
            "Brier score of predicted survival against the prefix label, by position.",
            "none",
            [(f"avg by (position) (dspark_confidence_brier{{{REQ}}})", "position " + by_pos)],
            thresholds=BRIER,
            w=8,
            min_val=0,
        ),
        timeseries(
            "AUROC by position",
            "How well predicted survival ranks accepted above rejected prefixes, by position; "
            "0.5 is chance.",
            "none",
            [(f"avg by (position) (dspark_confidence_auroc{{{REQ}}})", "position " + by_pos)],
            thresholds=AUROC,
            w=8,
            min_val=0,
            max_val=1,
        ),
        bar_gauge(
            "Reliability by bin",
            "Observed share of accepted prefixes per predicted-survival bin since start, all "
            "positions: (accepted_survival bucket difference) / (survival bucket difference). "
            "A calibrated predictor reads close to the bin's centre.",
            "percentunit",
            _reliability_queries(),
            thresholds=threshold_steps((None, BLUE)),
            w=24,
            max_val=1,
        ),
    ]
