"""The step-cost section: the additive cost table refitted from measured step times.

`cost_quality_table` is shared with `dspark-obs cost fit`, which prints the same table in
the terminal, so the two always agree on what "fits" means.
"""

from __future__ import annotations

from ...analysis.cost_fit import CostFit
from ..arms import Arm
from ..document import Section, Table, fmt
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
