"""P3 over a fleet: `summary`, `calibration`, `estimate`, `report` and the shipped SQL over 8
run directories holding 10 million request-steps in all (P3's budget each: 15 s, 3 GiB).

The runs are P3's: one reference run (compact, cap-accept shadow, the concurrency sweep
1..256) recorded through the real `run` command, tiled by `report_large.tile_run` into one
run of 10M / 8 request-steps (quick: 200k in all), then copied into 8 run directories of one
fleet directory, each naming its own `instance` in run.json (its node). Each command runs as
a child process over the fleet directory (`summary --by node,rank`, `calibration --by node`,
`estimate --by node`, `report --by node` with its PNGs, and `summary --sql` piped into
DuckDB), so each timing includes
interpreter start-up and imports, and its peak RSS is that child's alone (`time_child`). The
SQL's per-workload rows must equal `summary --json`'s, or the benchmark crashes.

Baseline: none run here; the same per-workload summary computed row by row in Python is
P3's baseline (`report_large`), and its rate applies per row.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dspark_obs.store.reader import MANIFEST

from .common import record, time_child
from .report_large import TARGET_RSS_MB, TARGET_S, base_run, tile_run

NODES = 8
FULL_REQUEST_STEPS = 10_000_000
QUICK_REQUEST_STEPS = 200_000

#: DuckDB in a child, the script on a file: what `dspark-obs summary --sql | duckdb` does.
_DUCKDB = (
    "import duckdb, json, sys; con = duckdb.connect(); con.execute('PRAGMA disable_progress_bar'); "
    "r = con.execute(open(sys.argv[1]).read()); "
    "names = [d[0] for d in r.description]; "
    "print(json.dumps([dict(zip(names, row)) for row in r.fetchall()]))"
)


WHAT = {
    "summary": "summary FLEET --by node,rank --json",
    "calibration": "calibration FLEET --by node --json",
    "estimate": "estimate FLEET --by node --json",
    "report": "report FLEET --by node --out DIR --quiet",
    "sql_duckdb": "summary --sql FLEET, run by DuckDB",
}


def make_fleet(root: Path, wanted: int, link: bool = False) -> tuple[Path, dict]:
    """8 nodes' runs of `wanted` request-steps in all, tiled from one run: copied, or with
    `link` hard-linked (a reader that caches nothing per file sees the same data, for an
    eighth of the disk)."""
    base, _ = base_run()
    base_rs = int(json.loads((base / MANIFEST).read_text(encoding="utf-8"))["request_steps"])
    copies = math.ceil(wanted / NODES / base_rs)
    fleet = root / "fleet"
    manifest = tile_run(base, fleet / "node-0", copies)
    for i in range(NODES):
        node = fleet / f"node-{i}"
        if i:
            shutil.copytree(fleet / "node-0", node, copy_function=os.link if link else shutil.copy2)
        (node / MANIFEST).unlink()  # its own file, never one linked to another node's
        (node / MANIFEST).write_text(
            json.dumps({**manifest, "instance": f"node-{i}"}, indent=2) + "\n", encoding="utf-8"
        )
    return fleet, {"copies": copies, "base_request_steps": base_rs, **manifest}


def _check_sql(sql_rows: bytes, summary: bytes) -> None:
    """The SQL's rows equal `summary --json`'s workloads, or the benchmark is void."""
    want = json.loads(summary)["workloads"]
    got = {r.pop("workload"): r for r in json.loads(sql_rows)}
    if set(got) != set(want):
        raise AssertionError(f"SQL workloads {sorted(got)} != summary's {sorted(want)}")
    for name, entry in got.items():
        for key, value in entry.items():
            other = want[name][key]
            same = value == other or (
                isinstance(value, float) and math.isclose(value, other, rel_tol=1e-9)
            )
            if not same:
                raise AssertionError(f"{name} {key}: SQL {value} != summary {other}")


def run(quick: bool) -> list[dict]:
    wanted = QUICK_REQUEST_STEPS if quick else FULL_REQUEST_STEPS
    repeats = 1 if quick else 3
    py = [sys.executable, "-m", "dspark_obs"]
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        fleet, manifest = make_fleet(root, wanted)
        generate_s = time.perf_counter() - start
        size = sum(f.stat().st_size for f in fleet.rglob("*") if f.is_file())
        script = root / "summary.sql"
        script.write_bytes(time_child([*py, "summary", "--sql", str(fleet)])[2])
        report = root / "report"
        commands = {
            "summary": [*py, "summary", str(fleet), "--by", "node,rank", "--json"],
            "calibration": [*py, "calibration", str(fleet), "--by", "node", "--json"],
            "estimate": [*py, "estimate", str(fleet), "--by", "node", "--json"],
            "report": [*py, "report", str(fleet), "--by", "node", "--out", str(report), "--quiet"],
            "sql_duckdb": [sys.executable, "-c", _DUCKDB, str(script)],
        }
        timings: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in commands}
        outputs = {}
        for _ in range(repeats):  # commands alternate, so each sees the same load
            for name, cmd in commands.items():
                seconds, rss, out = time_child(cmd)
                timings[name][0].append(seconds)
                timings[name][1].append(rss)
                outputs[name] = out
        _check_sql(outputs["sql_duckdb"], outputs["summary"])
    request_steps = manifest["request_steps"] * NODES
    out = []
    for name, (seconds, rss) in timings.items():
        peak = max(rss)
        out.append(
            record(
                f"P3_fleet_{name}",
                {
                    "runs": NODES,
                    "request_steps": request_steps,
                    "steps": manifest["steps"] * NODES,
                    "command": WHAT[name],
                },
                "s_per_command",
                seconds,
                1.0,
                target=TARGET_S,
                seconds=seconds,
                peak_rss_mb=peak,
                peak_rss_mb_repeats=rss,
                rss_target_mb=TARGET_RSS_MB,
                meets_rss_target=peak <= TARGET_RSS_MB,
                rows_per_s=request_steps / min(seconds),
                fleet_bytes=size,
                generate_seconds=generate_s,
            )
        )
    return out


if __name__ == "__main__":
    from .common import run_alone

    run_alone(run)
