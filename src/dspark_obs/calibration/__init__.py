"""Calibration: is the confidence head the scheduler trusts telling the truth, and STS to fix it."""

from .labels import prefix_labels
from .metrics import (
    CalibrationAccumulator,
    brier_score,
    expected_calibration_error,
    histogram_auroc,
    position_metrics,
)
from .sts import (
    TEMPERATURE_GRID,
    StsCalibration,
    apply_sts,
    fit_sts,
    load_sts,
    save_sts,
)

__all__ = [
    "TEMPERATURE_GRID",
    "CalibrationAccumulator",
    "StsCalibration",
    "apply_sts",
    "brier_score",
    "expected_calibration_error",
    "fit_sts",
    "histogram_auroc",
    "load_sts",
    "position_metrics",
    "prefix_labels",
    "save_sts",
]
