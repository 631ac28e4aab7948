"""The step-cost section: the additive cost table refitted from measured step times.

`cost_quality_table` is shared with `dspark-obs cost fit`, which prints the same table in
the terminal, so the two always agree on what "fits" means.
"""

from __future__ import annotations

from ...analysis.cost_fit import CostFit
from ...numbers import fmt
from ..arms import Arm
from ..document import Section, Table
from ..figure_queue import FigureQueue, arm_figures
from ..figures import cost as cost_fig


def cost_quality_table(fit: CostFit, title: str) -> Table:
    """How well the refitted table and the run's own table predict the measured steps."""
    rows = []
    for name, e in (("refitted table", fit.fitted), ("run's own table", fit.own)):
        if e is None:
            continue
        rows.append(
            [
                name,
                fmt(e.steps),
                fmt(e.r2, 4),
                fmt(e.rms_seconds * 1e3, 3),
                fmt(e.rel_error_median, 4),
                fmt(e.rel_error_mean, 4),
                fmt(e.bias_seconds * 1e3, 3),
            ]
        )
    columns = ["table", "steps", "R²", "RMS ms", "median rel. error", "mean rel. error"]
    return Table(
        title,
        [*columns, "bias ms"],
        rows,
        f"{fit.cells:,} (bs, M/64) cells; measured time: {fit.time_column}; bias = mean of "
        "measured - predicted",
    )


def context_tables(fit: CostFit, label: str) -> list[Table]:
    """The context-extended table against the additive one (held out), and both by context."""
    c = fit.context
    if c is None:
        return []
    held = [
        [name, fmt(e.steps), fmt(e.r2, 4), fmt(e.rms_seconds * 1e3, 3), fmt(e.rel_error_mean, 4)]
        for name, e in (("additive T(bs, K)", c.additive), ("with context", c.extended))
    ]
    per_token = c.table.context_seconds_per_token * 1e9
    buckets = [
        [
            f"{b.context:,}+",
            fmt(b.steps),
            fmt(b.mean_context, 0),
            fmt(b.additive_rel_bias, 4),
            fmt(b.additive_rel_error, 4),
            fmt(b.extended_rel_bias, 4),
            fmt(b.extended_rel_error, 4),
        ]
        for b in c.buckets
    ]
    return [
        Table(
            f"{label}: step cost with a context term, held out",
            ["table", "steps", "R²", "RMS ms", "mean rel. error"],
            held,
            f"T(bs, K, C) = T(bs, K) + c * C, C the step's context tokens: c = "
            f"{per_token:.4g} ns per token; both fitted on every other step of the "
            f"{c.steps:,} with a context, scored on the rest",
        ),
        Table(
            f"{label}: step-cost error by context length",
            [
                "context/request",
                "steps",
                "mean",
                "additive rel. bias",
                "additive rel. error",
                "with context rel. bias",
                "with context rel. error",
            ],
            buckets,
            "buckets of mean context tokens per request (powers of two); rel. bias = mean "
            "(measured - predicted) / measured, positive: the table is optimistic",
        ),
    ]


def cost_section(arms: list[Arm], w: FigureQueue) -> Section:
    s = Section(
        "cost",
        "Step-cost model",
        "The additive table T(bs, K) = bias + alpha(bs) + theta(bs + K) refitted from the "
        "measured step times (SGLang's OLS over (bs, M/64) cells), against the table the run "
        "used. `dspark-obs cost fit RUN --out table.json` writes the refitted table.",
    )
    for arm in arms:
        fit = arm.cost
        if fit is None:
            s.missing.append(f"{arm.label}: {arm.cost_missing}")
            continue
        s.tables.append(cost_quality_table(fit, f"{arm.label}: predicted vs measured step time"))
        s.tables += context_tables(fit, arm.label)
        s.figures += arm_figures(
            w,
            4,
            arm.label,
            (fit,),
            [
                (cost_fig.surface_figure, "cost-surface", "cell means and the fitted table"),
                (cost_fig.scatter_figure, "cost-scatter", "predicted vs measured step time"),
                (cost_fig.residual_figure, "cost-residuals", "residuals of the fitted table"),
            ],
        )
    return s
