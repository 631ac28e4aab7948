"""Timing and reporting shared by the benchmarks.

Figures are medians over repeats with their spread, and every record carries
the machine it ran on: absolute times on a noisy shared machine mean little,
ratios measured in the same run mean more.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable

import numpy as np


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
    }


def repeat(fn: Callable[[], object], repeats: int) -> list[float]:
    """Wall seconds of `fn()` per repeat (one untimed warm-up call first)."""
    fn()
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def summary(values: list[float], scale: float = 1.0) -> dict:
    v = sorted(x * scale for x in values)
    q1, q3 = np.percentile(v, [25, 75])
    return {
        "median": statistics.median(v),
        "p25": float(q1),
        "p75": float(q3),
        "min": v[0],
        "max": v[-1],
        "repeats": len(v),
    }


def record(
    name: str,
    parameters: dict,
    unit: str,
    values: list[float],
    scale: float,
    target: float | None = None,
    **extra,
) -> dict:
    s = summary(values, scale)
    out = {"name": name, "parameters": parameters, "unit": unit, **s}
    if target is not None:
        out["target"] = target
        out["meets_target"] = s["median"] <= target
    out.update(extra)
    out["machine"] = machine()
    return out
