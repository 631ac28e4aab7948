"""The dashboard's rows, one module per row, in page order.

Each module's `panels()` builds its row's panels; a row is found by its name here, and
adding one is a module and a line in `ROWS`.
"""

from . import (
    calibration,
    cost_model,
    estimator,
    load,
    overview,
    per_workload,
    sglang_check,
    sources,
    trim_cost,
    vllm_check,
)

ROWS = (
    ("Overview", overview.panels),
    ("Per workload", per_workload.panels),
    ("Cost of trimming", trim_cost.panels),
    ("Load", load.panels),
    ("Calibration", calibration.panels),
    ("Cost model", cost_model.panels),
    ("Estimator health", estimator.panels),
    ("Sources", sources.panels),
    ("Held against SGLang", sglang_check.panels),
    ("Held against vLLM", vllm_check.panels),
)
