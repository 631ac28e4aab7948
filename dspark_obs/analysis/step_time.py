"""Which measured step time a stored step has.

SGLang records GPU time with the `step_gpu_time` dump component and wall
(CPU) time with `step_cpu_time`; its own cost-table fit runs on the latter
(`SGLANG_DSPARK_ENABLE_SPS_RECORD=1` turns on just `core,step_cpu_time`). The
GPU time is the purer measure of the verify step, so it is preferred, and a run
that only has CPU time is still analysed rather than reported as untimed.
"""

from __future__ import annotations

import polars as pl


def measured_step_ms() -> pl.Expr:
    """GPU step time where recorded, else CPU step time; null when neither."""
    return pl.coalesce("step_gpu_ms", "step_cpu_ms").alias("step_ms")
