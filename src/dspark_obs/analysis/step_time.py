"""Which measured step time a stored step has.

SGLang records GPU time with the `step_gpu_time` dump component and wall
(CPU) time with `step_cpu_time`; its own cost-table fit runs on the latter
(`SGLANG_DSPARK_ENABLE_SPS_RECORD=1` turns on just `core,step_cpu_time`). The
GPU time is the purer measure of the verify step, so it is preferred, and a run
that only has CPU time is still analysed rather than reported as untimed.
"""

from __future__ import annotations

import polars as pl

#: Which measured time a step contributes: `auto` is GPU time where recorded, else CPU time.
TIME_COLUMNS = ("auto", "step_gpu_ms", "step_cpu_ms")


def measured_step_ms(column: str = "auto") -> pl.Expr:
    """The step's measured time, null where not recorded.

    `auto` is the choice every view makes (and the online refit); naming one
    column forces it, for a cost fit on CPU time alone, say, in a run that
    has both.
    """
    measured = pl.coalesce("step_gpu_ms", "step_cpu_ms") if column == "auto" else pl.col(column)
    return measured.alias("step_ms")
