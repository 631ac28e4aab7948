"""The cost-model row: does the step-cost table the scheduler plans with predict the steps?

Prediction and measurement are compared per mode and rank, since each rank runs its own
table; the online refit says whether the table's shape can fit at all.
"""

from __future__ import annotations

from ..panels import R2, REL_ERROR, stat_panel, timeseries
from ..promql import RI, STEP


def panels() -> list:
    return [
        timeseries(
            "Predicted vs measured step time",
            "Mean step time of the cost table's prediction T(bs, K) and of the measurement "
            "(step_gpu_ms, else step_cpu_ms), over steps that have both.",
            "s",
            [
                (
                    f"sum by (mode, rank) (rate(dspark_step_predicted_seconds_total{{{STEP}}}{RI}))"
                    f" / sum by (mode, rank) (rate(dspark_cost_model_steps_total{{{STEP}}}{RI}))",
                    "predicted {{mode}} r{{rank}}",
                ),
                (
                    f"sum by (mode, rank) (rate(dspark_step_measured_seconds_total{{{STEP}}}{RI}))"
                    f" / sum by (mode, rank) (rate(dspark_cost_model_steps_total{{{STEP}}}{RI}))",
                    "measured {{mode}} r{{rank}}",
                ),
            ],
            w=10,
            min_val=0,
        ),
        timeseries(
            "Relative error and bias",
            "Median |measured - predicted| / measured over the last N steps (15% resolution), "
            "and the mean absolute error relative to the mean measured step time.",
            "percentunit",
            [
                (
                    f"dspark_cost_model_relative_error_ratio{{{STEP}}}",
                    "median relative error {{mode}} r{{rank}}",
                ),
                (
                    f"dspark_cost_model_abs_error_seconds{{{STEP}}} / "
                    f"dspark_step_measured_seconds{{{STEP}}}",
                    "mean abs error / mean measured {{mode}} r{{rank}}",
                ),
            ],
            thresholds=REL_ERROR,
            w=10,
            min_val=0,
        ),
        stat_panel(
            "Refit R²",
            "R² of the additive table T = bias + alpha(bs) + theta(M) refitted online to the "
            "measured step times since start; low means the table's shape does not fit.",
            "none",
            [(f"min(dspark_cost_model_refit_r2{{{STEP}}})", "R²")],
            thresholds=R2,
            w=4,
            h=8,
            decimals=3,
        ),
    ]
