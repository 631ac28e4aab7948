"""P11: the real world's measured step times against SGLang's additive cost table and the
table with a context term.

The issue's check of the cost model on real hardware timings: a `--world real` run whose
verify forwards are timed on the device (`timing: measured`), with outputs long enough that
every request's context grows through its level, then `cost fit` on it. It reports the
additive table's R² against the measured times (target 0.95), the additive and the
context-extended forms on held-out steps, and both by context bucket. On a machine without
CUDA it runs the same path on the CPU at a toy size: a crash check, since a CPU's timings of
these small forwards say nothing about a GPU's.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from .common import record

R2_TARGET = 0.95


def run(quick: bool) -> list[dict]:
    try:
        import torch
    except ImportError:
        return [{**record("P11_real_cost", {}, "r2", [0.0], 1.0), "skipped": "no torch"}]
    from dspark_obs.analysis.cost_fit import fit_cost_table
    from dspark_obs.recording.reference import record_reference_run
    from dspark_obs.runtime.config import RuntimeConfig
    from dspark_obs.store import open_run

    device = "cuda" if torch.cuda.is_available() else "cpu"
    small = quick or device == "cpu"
    params = {
        "world": "real",
        "device": device,
        "concurrency": [1, 4] if small else [1, 8, 32, 64, 128, 256],
        "steps_per_level": 12 if small else 800,
        "max_new_tokens": 256 if small else 8192,
    }
    config = RuntimeConfig(seed=0, mode="compact", **params)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        record_reference_run(config, out, None)
        fit = fit_cost_table(open_run(out))
    context = fit.context.to_dict() if fit.context is not None else None
    rec = record("P11_real_cost", params, "r2", [fit.fitted.r2], 1.0)
    rec.update(
        r2_target=R2_TARGET,
        meets_r2_target=fit.fitted.r2 >= R2_TARGET,
        timed_steps=fit.steps,
        fitted=fit.fitted.to_dict(),
        constrained=fit.constrained,
        context=context,
        context_missing=fit.context_missing,
    )
    if device == "cpu":
        rec["note"] = "CPU: a crash check; the figure that counts is measured on a GPU"
    rec["machine"] = rec.pop("machine")
    return [rec]
