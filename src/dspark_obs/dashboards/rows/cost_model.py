"""The cost-model row: does the step-cost table the scheduler plans with predict the steps?

Prediction and measurement are compared per mode and rank, since each rank runs its own
table; the online refit says whether the table's shape can fit at all; the error by
context length whether the table drifts as conversations grow.
"""

from __future__ import annotations

from ..panels import NO_REFIT, NO_SERIES, NO_STEP_TIMES, R2, REL_ERROR, stat_panel, timeseries
from ..promql import RI, STEP, ratio

#: Each exporter's ranks run their own table: never sum two exporters' rank 0 together.
BY_LABELS = "by (instance, mode, rank)"
#: By context bucket, a ratio of sums over every table: where the tables drift together as
#: conversations grow, the additive form itself is short of a context term.
BY_CONTEXT = "by (mode, context)"


def _rate(counter: str) -> str:
    return f"sum {BY_LABELS} (rate(dspark_{counter}{{{STEP}}}{RI}))"


def _context_rate(counter: str) -> str:
    return f"sum {BY_CONTEXT} (rate(dspark_cost_model_context_{counter}{{{STEP}}}{RI}))"


def panels() -> list:
    timed = (NO_STEP_TIMES, NO_SERIES)
    refit = (NO_REFIT, NO_SERIES)
    return [
        timeseries(
            "Predicted vs measured step time",
            "Mean step time of the cost table's prediction T(bs, K) and of the measurement "
            "(step_gpu_ms, else step_cpu_ms), over steps that have both.",
            "s",
            [
                (
                    ratio(_rate("step_predicted_seconds_total"), _rate("cost_model_steps_total")),
                    "predicted {{mode}} r{{rank}} @{{instance}}",
                ),
                (
                    ratio(_rate("step_measured_seconds_total"), _rate("cost_model_steps_total")),
                    "measured {{mode}} r{{rank}} @{{instance}}",
                ),
            ],
            empty=timed,
            w=9,
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
                    "median relative error {{mode}} r{{rank}} @{{instance}}",
                ),
                (
                    ratio(
                        f"dspark_cost_model_abs_error_seconds{{{STEP}}}",
                        f"dspark_step_measured_seconds{{{STEP}}}",
                    ),
                    "mean abs error / mean measured {{mode}} r{{rank}} @{{instance}}",
                ),
            ],
            empty=timed,
            thresholds=REL_ERROR,
            w=9,
            min_val=0,
        ),
        stat_panel(
            "Refit R²",
            "R² of the additive table T = bias + alpha(bs) + theta(M) refitted online to the "
            "measured step times since start, per exporter, mode and rank. R² is the share of the "
            "step times' variance the table explains: where step times barely vary (one load "
            "level, a steady batch) there is little to explain and R² sits near 0 even for a "
            "table that predicts every step closely, so read it beside the refit's RMS error.",
            "none",
            [
                (
                    f"min {BY_LABELS} (dspark_cost_model_refit_r2{{{STEP}}})",
                    "{{mode}} r{{rank}} @{{instance}}",
                )
            ],
            empty=refit,
            thresholds=R2,
            w=3,
            h=8,
            decimals=3,
        ),
        stat_panel(
            "Refit RMS error",
            "Root-mean-square residual of that refit per step, per exporter, mode and rank: how "
            "far, in time, the refitted table misses a measured step. Small beside the step "
            "time means the table fits, whatever the R².",
            "s",
            [
                (
                    f"max {BY_LABELS} (dspark_cost_model_refit_rms_seconds{{{STEP}}})",
                    "{{mode}} r{{rank}} @{{instance}}",
                )
            ],
            empty=refit,
            w=3,
            h=8,
            decimals=None,
        ),
        timeseries(
            "Cost-table drift by context length",
            "Measured / predicted step time - 1 per context bucket (steps by mean context tokens "
            "per request, labelled by the bucket's lower bound): positive where the table is "
            "optimistic. SGLang's additive table T(bs, K) has no context term, so as "
            "conversations grow attention costs more than it predicts: a line that climbs with "
            "the bucket says the table drifts with context (`dspark-obs cost fit` fits one "
            "with a context term).",
            "percentunit",
            [
                (
                    ratio(
                        _context_rate("measured_seconds_total"),
                        _context_rate("predicted_seconds_total"),
                    )
                    + " - 1",
                    "{{mode}} context {{context}}+",
                )
            ],
            empty=timed,
            w=12,
        ),
        timeseries(
            "Relative error by context length",
            "Mean |measured - predicted| / measured of the cost table per context bucket.",
            "percentunit",
            [
                (
                    ratio(_context_rate("relative_error_total"), _context_rate("steps_total")),
                    "{{mode}} context {{context}}+",
                )
            ],
            empty=timed,
            thresholds=REL_ERROR,
            w=12,
            min_val=0,
        ),
    ]
