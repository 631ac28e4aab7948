"""P3: `dspark-obs report` on a 10-million request-step run (target 15 s, 3 GiB peak RSS).

The large run is the reference runtime's own output repeated: one modest run
(compact mode, cap-accept shadow, a concurrency sweep 1..256, ~49k
request-steps) is recorded through the real `run` command, then its Parquet
parts are tiled K times into a new run directory until it holds at least 10M
request-steps (quick: ~200k). Each copy is its own part (same schema and layout,
published with its checksum record as the run store does, so `report` verifies it),
with `forward_ct` shifted by the base run's span, `rid` suffixed with `.k` and
`resolved_at` (where >= 0) shifted in every table that has those columns; the
counts in run.json are scaled. So the distributions (windows, ceilings, load,
confidence, step times) are realistic, the steps stay unique and ordered, and
request ids are unique across copies. The tiling is done with Polars
expressions, never row by row in Python.

`report` runs as a child process (`python -m dspark_obs report RUN --out OUT
--quiet`), so each timing includes interpreter start-up and imports, as a user
sees it. Its peak RSS is the `ru_maxrss` that `os.wait4` returns for that one
child, so the generator's child (or an earlier repeat) cannot leak into it.
There is no untimed warm-up: the run was just written, so its files are in the
page cache already. Generated runs and reports live in temporary directories
removed when the process ends; the large run is built once per process and size
(`large_run`), so `whatif_large` in the same `python -m bench` times the same run.

Baseline: the per-workload summary (mean window, accepted and ceiling,
utilisation) computed the SGLang way, a Python loop over the request rows
(`DataFrame.iter_rows`, `baselines.per_row_workload_summary`), timed on a
200k-row slice of the same requests table (loaded untimed) and checked against
polars on that slice. The comparison is per row: `baseline_median` is the
slice's time scaled to the run's request-steps, so `ratio` is the baseline's
seconds per row over ours. Ours is the whole `report` (start-up, the summary,
the estimator evaluation, figures, HTML), the baseline one summary, so the ratio
is conservative; `slice_summary` also times the same summary with polars on the
same slice, a like-for-like ratio.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

import polars as pl

from dspark_obs.store.reader import MANIFEST, list_parts, part_name
from dspark_obs.store.writer import publish_part

from .baselines import per_row_workload_summary, polars_workload_summary
from .common import record, repeat_pair, time_child, with_baseline

TARGET_S = 15.0
TARGET_RSS_MB = 3 * 1024.0  # MiB
FULL_REQUEST_STEPS = 10_000_000
QUICK_REQUEST_STEPS = 200_000

BASE_ARGS = (
    "--mode",
    "compact",
    "--shadow",
    "cap-accept",
    "--concurrency",
    "1,8,32,64,128,256",
    "--steps-per-level",
    "100",
    "--quiet",
)

#: Rows of the requests table the per-row baseline loops over.
BASELINE_ROWS = 200_000
BASELINE_COLUMNS = ("workload", "window", "correct_drafts", "ceiling", "shadow_ceiling")

#: Manifest fields that count what the tables hold, scaled by the number of copies.
COUNTS = (
    "steps",
    "request_steps",
    "parts",
    "dropped_steps",
    "requests_arrived",
    "requests_finished",
)


def run_dspark(*args: str | Path) -> None:
    """Run `python -m dspark_obs ARGS` quietly; its output only shows when it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"dspark_obs {args[0]} failed ({proc.returncode}):\n"
            + proc.stdout.decode(errors="replace")
        )


def _shifted(df: pl.DataFrame, k: int, span: int) -> pl.DataFrame:
    """Copy `k` of a base part: later steps, its own request ids, same schema."""
    shift = k * span
    exprs = []
    if "forward_ct" in df.columns:
        exprs.append(pl.col("forward_ct") + shift)
    if "resolved_at" in df.columns:
        exprs.append(
            pl.when(pl.col("resolved_at") >= 0)
            .then(pl.col("resolved_at") + shift)
            .otherwise(pl.col("resolved_at"))
            .alias("resolved_at")
        )
    if "rid" in df.columns:
        exprs.append(pl.col("rid") + pl.lit(f".{k}"))
    out = df.with_columns(exprs).cast(df.schema)
    assert out.schema == df.schema
    return out


def tile_run(base: Path, out: Path, copies: int) -> dict:
    """Write `copies` shifted copies of run `base` into `out`; returns the new manifest."""
    manifest = json.loads((base / MANIFEST).read_text(encoding="utf-8"))
    tables = {d.name: list_parts(d) for d in sorted(base.iterdir()) if d.is_dir()}
    tables = {name: parts for name, parts in tables.items() if parts}
    numbers = sorted({n for parts in tables.values() for n, _ in parts})
    index = {n: i for i, n in enumerate(numbers)}
    steps_ct = pl.scan_parquet([str(p) for _, p in tables["steps"]], glob=False).select(
        lo=pl.col("forward_ct").min(), hi=pl.col("forward_ct").max()
    )
    lo, hi = steps_ct.collect().row(0)
    span = int(hi) - int(lo) + 1

    out.mkdir(parents=True)
    for f in base.iterdir():  # sidecar files (sts.json, ...) come along unchanged
        if f.is_file() and f.name != MANIFEST:
            shutil.copy2(f, out / f.name)
    frames = {name: [(n, pl.read_parquet(p)) for n, p in parts] for name, parts in tables.items()}
    for k in range(copies):
        for name, parts in frames.items():
            for n, df in parts:
                # published as the run store publishes a part, checksum record included,
                # so that `report` pays for verifying every part as on a real run
                publish_part(
                    out / name / part_name(k * len(numbers) + index[n]), _shifted(df, k, span)
                )
    for key in COUNTS:
        if isinstance(manifest.get(key), int):
            manifest[key] *= copies
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def time_report(run_dir: Path, out: Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one `report` child process."""
    return time_dspark("report", run_dir, "--out", out, "--quiet")


def time_dspark(*args: str | Path) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of one `python -m dspark_obs ARGS` child process."""
    seconds, rss, _ = time_child([sys.executable, "-m", "dspark_obs", *map(str, args)])
    return seconds, rss


def baseline_slice(run_dir: Path, rows: int) -> pl.DataFrame:
    """The first `rows` request rows, the columns the per-workload summary needs."""
    files = [str(p) for _, p in list_parts(run_dir / "requests")]
    return pl.scan_parquet(files, glob=False).select(BASELINE_COLUMNS).head(rows).collect()


def check_summary(df: pl.DataFrame) -> dict:
    """The row loop's summary equals polars' on the same rows."""
    loop = per_row_workload_summary(df.iter_rows())
    ref = polars_workload_summary(df)
    if set(loop) != set(ref):
        raise AssertionError(f"workloads differ: {sorted(loop)} vs {sorted(ref)}")
    for w, entry in loop.items():
        for key, value in entry.items():
            other = ref[w][key]
            if (value is None) != (other is None) or (
                value is not None and not math.isclose(value, other, rel_tol=1e-9)
            ):
                raise AssertionError(f"{w} {key}: {value} vs {other}")
    return {"workloads": len(loop), "rows": df.height}


@cache
def base_run() -> tuple[Path, tempfile.TemporaryDirectory]:
    """The reference run the large runs are tiled from (`BASE_ARGS`), recorded once per
    process; the directory lives as long as the cache holds it."""
    tmp = tempfile.TemporaryDirectory(prefix="bench-base-run-")
    base = Path(tmp.name) / "base"
    run_dspark("run", *BASE_ARGS, "--out", base)
    return base, tmp


@cache
def large_run(wanted: int) -> tuple[Path, dict]:
    """The tiled run of at least `wanted` request-steps, its manifest extended with how it
    was made (`copies`, `base_request_steps`, `generate_seconds`, `bytes`). Built once
    per process: its temporary directory lives as long as the cache holds it."""
    tmp = tempfile.TemporaryDirectory(prefix="bench-large-run-")
    root = Path(tmp.name)
    base, _ = base_run()
    base_rs = int(json.loads((base / MANIFEST).read_text(encoding="utf-8"))["request_steps"])
    copies = math.ceil(wanted / base_rs)
    start = time.perf_counter()
    manifest = tile_run(base, root / "large", copies)
    made = {
        "copies": copies,
        "base_request_steps": base_rs,
        "generate_seconds": time.perf_counter() - start,
        "bytes": sum(f.stat().st_size for f in (root / "large").rglob("*") if f.is_file()),
        "keep": tmp,
    }
    return root / "large", {**manifest, **made}


def run(quick: bool) -> list[dict]:
    repeats = 1 if quick else 3
    large, manifest = large_run(QUICK_REQUEST_STEPS if quick else FULL_REQUEST_STEPS)
    copies, base_rs = manifest["copies"], manifest["base_request_steps"]
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        root = Path(tmp)
        seconds, rss = [], []
        for i in range(repeats):
            s, r = time_report(large, root / f"report-{i}")
            seconds.append(s)
            rss.append(r)
            shutil.rmtree(root / f"report-{i}")
    rows = baseline_slice(large, BASELINE_ROWS)
    checked = check_summary(rows)
    n = 1 if quick else 5
    base_times, polars_times = repeat_pair(
        lambda: per_row_workload_summary(rows.iter_rows()),
        lambda: polars_workload_summary(rows),
        n,
        n,
    )
    peak = max(rss)
    rec = record(
        "P3_report_large",
        {
            "request_steps": manifest["request_steps"],
            "steps": manifest["steps"],
            "copies": copies,
            "base_request_steps": base_rs,
        },
        "s_per_report",
        seconds,
        1.0,
        target=TARGET_S,
        request_steps=manifest["request_steps"],
        seconds=seconds,
        peak_rss_mb=peak,
        peak_rss_mb_repeats=rss,
        rss_target_mb=TARGET_RSS_MB,
        meets_rss_target=peak <= TARGET_RSS_MB,
        run_bytes=manifest["bytes"],
        generate_seconds=manifest["generate_seconds"],
    )
    request_steps = int(manifest["request_steps"])
    base_rate = rows.height / statistics.median(base_times)
    return [
        with_baseline(
            rec,
            base_times,
            request_steps / rows.height,
            baseline="per-row Python loop (iter_rows) computing the per-workload summary "
            "(mean window / accepted / ceiling, utilisation)",
            ratio_note=f"per-row rate ratio: the baseline is timed on a {rows.height:,}-row "
            "slice of the same requests table and scaled to the run's request-steps; ours is "
            "the whole report",
            baseline_rows=rows.height,
            baseline_rows_per_s=base_rate,
            ours_rows_per_s=request_steps / rec["median"],
            baseline_check=checked,
            slice_summary={
                "what": "the same per-workload summary on the same slice, polars vs the loop",
                "polars_median_s": statistics.median(polars_times),
                "loop_median_s": statistics.median(base_times),
                "ratio": statistics.median(base_times) / statistics.median(polars_times),
            },
        )
    ]
