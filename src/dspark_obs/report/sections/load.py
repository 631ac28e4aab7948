"""The load section: what the scheduler did and what it cost at each batch size.

Load curves share their axes across runs, so this section overlays every arm in one
figure where the others repeat per arm.
"""

from __future__ import annotations

import polars as pl

from ..arms import Arm
from ..document import Section
from ..figure_queue import FigureQueue
from ..figures import load as load_fig
from .tables import Cell, num_cell, rows_table

NO_TIMES = (
    "no step times (step_gpu_ms / step_cpu_ms): SGLang records them with the "
    "step_gpu_time or step_cpu_time dump components (SGLANG_DSPARK_ENABLE_SPS_RECORD=1)"
)


_LOAD_COLUMNS: dict[str, Cell] = {
    "bs": num_cell("bs"),
    "steps": num_cell("steps"),
    "budget/request": num_cell("budget_per_request"),
    "verify tokens/step": num_cell("verify_tokens_per_step", 1),
    "step ms": num_cell("mean_step_ms", 2),
    "throughput tok/s": num_cell("throughput_tokens_per_s", 0),
    "per-user tok/s": num_cell("per_user_tokens_per_s", 1),
}


def load_section(arms: list[Arm], w: FigureQueue) -> Section:
    s = Section(
        "load",
        "Load",
        "Per load level (batch size): the scheduler's verify budget per request, verify tokens "
        "per step, step time, total throughput (summed over data-parallel ranks) and per-user "
        "decode speed (committed tokens over the step time each request sat through).",
    )
    for arm in arms:
        s.tables.append(
            rows_table(f"{arm.label}: load levels", _LOAD_COLUMNS, arm.load.iter_rows(named=True))
        )
        if arm.load["throughput_tokens_per_s"].is_null().all():
            s.missing.append(f"{arm.label}: {NO_TIMES}")
        if arm.load.height < 2:
            s.missing.append(
                f"{arm.label}: a single load level, so no sweep to draw "
                "(run a concurrency sweep, e.g. `run --concurrency 1,8,32,64,128,256`)"
            )
    arms_load = [(a.label, a.load) for a in arms]
    if any(f.filter(pl.col("throughput_tokens_per_s").is_not_null()).height for _, f in arms_load):
        s.figures.append(
            w.save(
                2,
                load_fig.throughput_figure,
                (arms_load,),
                "throughput",
                "Throughput vs per-user speed",
            )
        )
        s.figures.append(
            w.save(2, load_fig.step_time_figure, (arms_load,), "step-time", "Step time vs bs")
        )
    if any(f["budget_per_request"].is_not_null().any() for _, f in arms_load):
        s.figures.append(
            w.save(2, load_fig.budget_figure, (arms_load,), "budget", "Budget per request vs bs")
        )
    return s
