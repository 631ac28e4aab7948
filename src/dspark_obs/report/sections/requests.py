"""The requests section: the requests that lost the most to trimming, step by step.

The drill-down a reader reaches for after the aggregate sections: which requests paid for
the scheduler's trimming, and what their windows looked like.
"""

from __future__ import annotations

from ..arms import TRACED_REQUESTS, Arm, arms_palette
from ..document import Section
from ..figure_queue import FigureQueue, arm_figures
from ..figures import requests as requests_fig
from .tables import Cell, name_cell, num_cell, rows_table

_REQUEST_COLUMNS: dict[str, Cell] = {
    "rid": lambda r: r["rid"],
    "workload": name_cell("workload"),
    "steps": num_cell("steps"),
    "committed": num_cell("committed"),
    "window": num_cell("mean_window", 2),
    "accepted": num_cell("mean_accepted", 2),
    "ceiling (known rows)": num_cell("mean_ceiling", 2),
    "trim loss": num_cell("trim_loss", 1),
    "loss share": num_cell("loss_share", 3),
    "unknown steps": num_cell("unknown_steps"),
}


def requests_section(arms: list[Arm], w: FigureQueue, top: int) -> Section:
    s = Section(
        "requests",
        "Requests that lost the most to trimming",
        f"The {top} requests with the largest trim loss (ceiling - accepted, summed over their "
        "steps). The ceiling per step is observed, the shadow's, exact when the window was not "
        "fully accepted, or the tail walk's point estimate; unknown steps make the loss a lower "
        "bound.",
    )
    palette = arms_palette(arms)
    for arm in arms:
        if arm.top is None:
            s.missing.append(
                f"{arm.label}: no trimmed request-step has a known or estimated ceiling, so no "
                "trim loss is visible (a cap-accept shadow, or walks: greedy requests, or sampled "
                "ones with target log-probabilities, e.g. `ingest --assume greedy` for greedy "
                "traffic)"
            )
            continue
        s.tables.append(
            rows_table(
                f"{arm.label}: top {arm.top.height} requests by trim loss",
                _REQUEST_COLUMNS,
                arm.top.iter_rows(named=True),
            )
        )
        s.figures += arm_figures(
            w,
            6,
            arm.label,
            (arm.label, arm.top, palette),
            [(requests_fig.top_requests_figure, "top-requests", "largest trim losses")],
        )
        if arm.traces is not None and arm.traces.height:
            rids = arm.top["rid"].head(TRACED_REQUESTS).to_list()
            observed = arm.summary["overall"]["ceiling_source"] is not None
            caption = (
                f"windows of the {len(rids)} requests that lost the most, one panel each "
                f"(the first {len(rids)} of the table's {arm.top.height}: a panel holds "
                "every step of its request, so more would not read)"
            )
            s.figures += arm_figures(
                w,
                6,
                arm.label,
                (arm.label, arm.traces, rids, palette, arm.gamma, observed),
                [(requests_fig.traces_figure, "traces", caption)],
            )
    return s
