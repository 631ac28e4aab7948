"""Timing and reporting shared by the benchmarks.

Figures are medians over repeats with their spread, and every record carries
the machine it ran on: absolute times on a noisy shared machine mean little,
ratios measured in the same run mean more.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

#: Whether this process keeps freed memory for reuse, as `dspark-obs` processes do.
ALLOCATOR = {"kept": False}


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "freed_memory_kept": ALLOCATOR["kept"],
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


def repeat_pair(
    ours: Callable[[], object],
    baseline: Callable[[], object],
    repeats: int,
    baseline_repeats: int,
) -> tuple[list[float], list[float]]:
    """Wall seconds per repeat of ours and of the baseline, timed alternately (one untimed
    warm-up call of each first), so that both see the same load on a shared machine."""
    ours()
    baseline()
    mine, theirs = [], []
    for i in range(max(repeats, baseline_repeats)):
        for fn, out, n in ((ours, mine, repeats), (baseline, theirs, baseline_repeats)):
            if i < n:
                start = time.perf_counter()
                fn()
                out.append(time.perf_counter() - start)
    return mine, theirs


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


def skipped_without(name: str, module: str | None = None) -> list[dict] | None:
    """The record a GPU benchmark gives where it cannot run (no CUDA, or `module` not
    installed), or None where it can: CI and CPU machines run every benchmark, and these
    say why they measured nothing instead of failing."""
    import importlib.util

    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        reason = "no CUDA"
    elif module is not None and importlib.util.find_spec(module) is None:
        reason = f"no {module}"
    else:
        return None
    return [{**record(name, {}, "ms", [0.0], 1.0), "repeats": 0, "skipped": reason}]


def with_baseline(
    rec: dict,
    baseline_values: list[float],
    scale: float,
    ratio_target: float | None = None,
    *,
    higher_is_better: bool = False,
    **extra,
) -> dict:
    """Add the SGLang-style baseline measured in the same run: its median and spread, and
    `ratio`, how many times faster ours is (baseline / ours for times, ours / baseline for
    rates: `higher_is_better`), with its target if any."""
    s = summary(baseline_values, scale)
    rec["baseline_median"] = s["median"]
    rec["baseline_p25"] = s["p25"]
    rec["baseline_p75"] = s["p75"]
    rec["baseline_repeats"] = s["repeats"]
    num, den = (rec["median"], s["median"]) if higher_is_better else (s["median"], rec["median"])
    rec["ratio"] = num / den if den > 0 else float("inf")
    if ratio_target is not None:
        rec["ratio_target"] = ratio_target
        rec["meets_ratio_target"] = rec["ratio"] >= ratio_target
    rec.update(extra)
    rec["machine"] = rec.pop("machine")  # keep the machine last
    return rec


def _maxrss_mb(ru_maxrss: int) -> float:
    """`ru_maxrss` in MiB (Linux reports KiB, macOS bytes)."""
    return ru_maxrss / (1024.0 * 1024.0) if sys.platform == "darwin" else ru_maxrss / 1024.0


def time_child(cmd: list[str]) -> tuple[float, float, bytes]:
    """Wall seconds, peak RSS (MiB) and stdout of one child process, as a user runs it.

    The peak is the `ru_maxrss` that `os.wait4` returns for that one child, so no other
    process (an earlier repeat, a generator) leaks into it. A failed child is a crash.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        seconds = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(
                f"{' '.join(cmd[:4])} failed ({proc.returncode}):\n"
                + err.read().decode(errors="replace")
            )
        out.seek(0)
        return seconds, _maxrss_mb(usage.ru_maxrss), out.read()


def run_alone(run: Callable[[bool], list[dict]]) -> None:
    """`python -m bench.NAME [--json] [--quick]`: one benchmark without importing the others,
    whose needs (polars, the compiled parts) a GPU machine may lack."""
    for rec in run("--quick" in sys.argv):
        print(json.dumps(rec) if "--json" in sys.argv else rec, flush=True)
