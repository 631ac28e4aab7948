"""The calibration row: does the drafter's predicted survival match what was accepted?

The reliability bars read the exporter's ECE-bin counters, one query a bin, so they are
generated from the same bin count.
"""

from __future__ import annotations

from ...aggregates.confidence import ECE_BINS
from ..panels import (
    AUROC,
    BLUE,
    BRIER,
    ECE,
    NO_CONFIDENCE,
    NO_SERIES,
    bar_gauge,
    threshold_steps,
    timeseries,
)
from ..promql import REL, REQ, ratio


def _reliability_queries() -> list[tuple[str, str]]:
    """Observed acceptance per predicted-survival bin: positives / rows of that bin."""
    out = []
    for k in range(ECE_BINS):
        sel = f'{REL}, bin="{k}"'
        num = f"sum(dspark_confidence_bin_positives_total{{{sel}}})"
        den = f"sum(dspark_confidence_bin_rows_total{{{sel}}})"
        out.append((ratio(num, den), f"{k / ECE_BINS:.2f}-{(k + 1) / ECE_BINS:.2f}"))
    return out


def panels() -> list:
    by_pos = "{{position}}"
    empty = (NO_CONFIDENCE, NO_SERIES)
    return [
        timeseries(
            "ECE by position",
            "Expected calibration error of predicted survival at each draft position over the "
            "last N steps (15 equal-width bins), averaged over the selected series.",
            "percentunit",
            [(f"avg by (position) (dspark_confidence_ece{{{REQ}}})", "position " + by_pos)],
            empty=empty,
            thresholds=ECE,
            w=8,
            min_val=0,
        ),
        timeseries(
            "Brier score by position",
            "Brier score of predicted survival against the prefix label, by position.",
            "none",
            [(f"avg by (position) (dspark_confidence_brier{{{REQ}}})", "position " + by_pos)],
            empty=empty,
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
            empty=empty,
            thresholds=AUROC,
            w=8,
            min_val=0,
            max_val=1,
        ),
        bar_gauge(
            "Reliability by bin",
            "Observed share of accepted prefixes per predicted-survival bin since start, all "
            "positions: the bin's accepted rows / its rows (dspark_confidence_bin_*). A "
            "calibrated predictor reads close to the bin's centre.",
            "percentunit",
            _reliability_queries(),
            empty=empty,
            thresholds=threshold_steps((None, BLUE)),
            w=24,
            max_val=1,
        ),
    ]
