"""The calibration row: does the drafter's predicted survival match what was accepted?

The reliability bars read the exporter's ECE-bin counters, one query a bin, so they are
generated from the same bin count.
"""

from __future__ import annotations

from ..panels import NO_CONFIDENCE, NO_SERIES, calibration_timeseries, reliability_bars
from ..promql import REL, REQ, ratio

#: the per-position gauges (their figure, title and description)
BY_POSITION = (
    (
        "ECE",
        "ECE by position",
        "Expected calibration error of predicted survival at each draft position over the "
        "last N steps (15 equal-width bins), averaged over the selected series.",
    ),
    (
        "Brier",
        "Brier score by position",
        "Brier score of predicted survival against the prefix label, by position.",
    ),
    (
        "AUROC",
        "AUROC by position",
        "How well predicted survival ranks accepted above rejected prefixes, by position; "
        "0.5 is chance.",
    ),
)


def _reliability_query(k: int) -> str:
    """Observed acceptance in predicted-survival bin k: positives / rows of that bin."""
    sel = f'{REL}, bin="{k}"'
    num = f"sum(dspark_confidence_bin_positives_total{{{sel}}})"
    den = f"sum(dspark_confidence_bin_rows_total{{{sel}}})"
    return ratio(num, den)


def panels() -> list:
    empty = (NO_CONFIDENCE, NO_SERIES)
    return [
        *(
            calibration_timeseries(
                figure,
                title,
                description,
                [
                    (
                        f"avg by (position) (dspark_confidence_{figure.lower()}{{{REQ}}})",
                        "position {{position}}",
                    )
                ],
                empty=empty,
                w=8,
            )
            for figure, title, description in BY_POSITION
        ),
        reliability_bars(
            "Observed share of accepted prefixes per predicted-survival bin since start, all "
            "positions: the bin's accepted rows / its rows (dspark_confidence_bin_*). A "
            "calibrated predictor reads close to the bin's centre.",
            _reliability_query,
            empty=empty,
            w=24,
        ),
    ]
