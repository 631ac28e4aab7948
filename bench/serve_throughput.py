"""P6: end-to-end `serve` throughput on one core, against the SGLang-style baseline.

A stored run (the reference runtime, compact mode with a cap-accept shadow,
batch sizes 64 and 256, tiled like P3's large run until it holds
`QUICK_REQUEST_STEPS` / `FULL_REQUEST_STEPS` request-steps) is replayed by
`dspark-obs serve --source run:RUN_DIR --speed 0` (`--speed 0`: no pacing, as
fast as it can) in a child process pinned to one core. The figure is
request-steps per second from the moment the child says it is serving (start-up,
imports and opening the run are behind it) to the moment it says the source
ended; the child keeps serving its final values, its own counters are then read
from `/metrics` (steps ingested, request-steps aggregated) and must equal the
run's size, and it is stopped with SIGTERM. While it runs, `/metrics` is also
scraped every `SCRAPE_EVERY` seconds, and the rate between the first and last
scrape that saw progress is reported as `counter_rate` (a scrape costs the
child a render, so this one is slightly lower).

The baseline is the same records processed the SGLang way in one Python process,
also pinned to one core: the run read step by step (`Run.batches()`, the same
reader `serve` uses) and fed to `baselines.SGLangStyleAggregates`, timed inside
the process. Ours also runs the ceiling estimator and an HTTP server, the
baseline only aggregates, so the ratio (ours / baseline, in request-steps per
second) is conservative.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from dspark_obs.store import open_run
from dspark_obs.store.reader import MANIFEST

from .baselines import SGLangStyleAggregates
from .common import record, with_baseline
from .report_large import run_dspark, tile_run
from .serve_child import SERVING, serve_args

QUICK_REQUEST_STEPS = 100_000
FULL_REQUEST_STEPS = 1_000_000
SCRAPE_EVERY = 0.5
BASE_ARGS = (
    "--mode",
    "compact",
    "--shadow",
    "cap-accept",
    "--concurrency",
    "64,256",
    "--quiet",
)
_ENDED = re.compile(r"^source .* ended after (?P<steps>[\d,]+) steps")


def _core() -> int | None:
    """The core children are pinned to (the first this process may use), or None."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    return min(os.sched_getaffinity(0))


def _pinned(core: int | None):
    if core is None:
        return None
    return lambda: os.sched_setaffinity(0, {core})


def _metric_sums(text: str) -> dict[str, float]:
    """Sum of every series of each metric name in an exposition text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        out[name] = out.get(name, 0.0) + float(value)
    return out


def _scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return _metric_sums(resp.read().decode())


def serve_once(run_dir: Path, core: int | None, timeout: float = 300.0) -> dict:
    """Replay `run_dir` through a `serve` child; its rates and final counters."""
    cmd = [sys.executable, "-m", "dspark_obs", *serve_args(f"run:{run_dir}", speed=0)]
    lines: queue.Queue = queue.Queue()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            preexec_fn=_pinned(core),
        )

        def reader() -> None:
            for line in proc.stdout:
                lines.put((time.perf_counter(), line.strip()))
            lines.put((time.perf_counter(), None))

        threading.Thread(target=reader, daemon=True).start()
        try:
            url = start = end = None
            steps = 0
            scrapes: list[tuple[float, float]] = []
            deadline = time.monotonic() + timeout
            while end is None:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"serve did not finish within {timeout:.0f} s")
                try:
                    at, line = lines.get(timeout=SCRAPE_EVERY if url else 1.0)
                except queue.Empty:
                    if url:
                        sums = _scrape(url)
                        scrapes.append(
                            (time.perf_counter(), sums.get("dspark_request_steps_total", 0.0))
                        )
                    continue
                if line is None:
                    err.seek(0)
                    raise RuntimeError(
                        f"serve exited ({proc.wait()}):\n" + err.read().decode(errors="replace")
                    )
                if m := SERVING.match(line):
                    url, start = m.group("url"), at
                elif m := _ENDED.match(line):
                    end, steps = at, int(m.group("steps").replace(",", ""))
            final = _scrape(url)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    request_steps = final.get("dspark_request_steps_total", 0.0)
    moving = [(t, n) for t, n in scrapes if 0 < n < request_steps]
    counter_rate = None
    if len(moving) >= 2 and moving[-1][0] > moving[0][0]:
        counter_rate = (moving[-1][1] - moving[0][1]) / (moving[-1][0] - moving[0][0])
    return {
        "seconds": end - start,
        "steps": steps,
        "ingested_steps": final.get("dspark_ingest_records_total", 0.0),
        "request_steps": request_steps,
        "counter_rate": counter_rate,
        "scrapes": len(scrapes),
    }


def baseline_once(run_dir: Path, core: int | None) -> dict:
    """The SGLang-style aggregation of the same run in its own pinned process."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.serve_throughput", "--baseline", str(run_dir)],
        capture_output=True,
        text=True,
        check=False,
        preexec_fn=_pinned(core),
        cwd=Path(__file__).resolve().parent.parent,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"baseline failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _baseline_main(run_dir: str) -> int:
    start = time.perf_counter()
    run = open_run(run_dir)
    base = SGLangStyleAggregates(int(run.manifest["gamma"]))
    steps = request_steps = 0
    for batch in run.batches():
        base.update_batch(batch)
        steps += 1
        request_steps += batch.num_reqs
    seconds = time.perf_counter() - start
    counted = int(sum(t[: base.gamma + 1].sum() for t in base.totals()["tokens"]))
    start = time.perf_counter()
    for _ in open_run(run_dir).batches():
        pass
    read_seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "seconds": seconds,
                "read_only_seconds": read_seconds,
                "steps": steps,
                "request_steps": request_steps,
                "counted_request_steps": counted,
            }
        )
    )
    return 0


def run(quick: bool) -> list[dict]:
    wanted = QUICK_REQUEST_STEPS if quick else FULL_REQUEST_STEPS
    repeats = 1 if quick else 3
    core = _core()
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        root = Path(tmp)
        base = root / "base"
        run_dspark("run", *BASE_ARGS, "--steps-per-level", "100", "--out", base)
        base_rs = int(json.loads((base / MANIFEST).read_text(encoding="utf-8"))["request_steps"])
        copies = math.ceil(wanted / base_rs)
        manifest = tile_run(base, root / "large", copies)
        size = int(manifest["request_steps"])
        ours, theirs = [], []
        for _ in range(repeats):  # alternately, so both see the same machine load
            ours.append(serve_once(root / "large", core))
            theirs.append(baseline_once(root / "large", core))
    for o in ours:
        if o["steps"] != manifest["steps"] or int(o["ingested_steps"]) != manifest["steps"]:
            raise AssertionError(
                f"serve ingested {o['steps']} steps, the run has {manifest['steps']}"
            )
        if int(o["request_steps"]) != size:
            raise AssertionError(f"serve counted {o['request_steps']} request-steps, not {size}")
    for t in theirs:
        if t["request_steps"] != size or t["counted_request_steps"] != size:
            raise AssertionError(f"baseline saw {t['request_steps']} request-steps, not {size}")
    rates = [size / o["seconds"] for o in ours]
    counter_rates = [o["counter_rate"] for o in ours if o["counter_rate"]]
    rec = record(
        "P6_serve_throughput",
        {
            "request_steps": size,
            "steps": manifest["steps"],
            "copies": copies,
            "concurrency": "64,256",
            "gamma": manifest["gamma"],
            "cores": 1,
        },
        "request_steps_per_s",
        rates,
        1.0,
        seconds=[o["seconds"] for o in ours],
        counter_rate=sorted(counter_rates)[len(counter_rates) // 2] if counter_rates else None,
        scrapes=[o["scrapes"] for o in ours],
        pinned_core=core,
        command=f"dspark-obs serve --source run:RUN_DIR --speed 0 (pinned to core {core})",
    )
    return [
        with_baseline(
            rec,
            [size / t["seconds"] for t in theirs],
            1.0,
            higher_is_better=True,
            baseline="SGLang-style aggregation of the same records in one Python process "
            "pinned to the same core: Run.batches(), .tolist() per step into per-request "
            "records, Python loop over the counters",
            ratio_note="ratio = ours / baseline request-steps per second; conservative: ours "
            "also runs the ceiling estimator and serves HTTP",
            baseline_seconds=[t["seconds"] for t in theirs],
            read_only_seconds=[t["read_only_seconds"] for t in theirs],
            read_only_note="reading the run into StepBatches alone (Run.batches()), which "
            "both sides include",
        )
    ]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--baseline":
        sys.exit(_baseline_main(sys.argv[2]))
    sys.exit("usage: python -m bench.serve_throughput --baseline RUN_DIR")
