"""P13: peak memory of `ingest` of a many-rank `/server_info` file, per MB of input.

A 256-rank answer (each rank the greedy sample's records, with their requests: about
140 MB in the full profile) has hundreds of (rank, workload) label groups. `ingest` is run
on it as it is (`after`) and as it was (`before`: with the request rows folded into the
live aggregates, whose histograms cost about 1 MB a group and which nothing of a run
directory reads), alternated, each in a fresh process. Its peak resident size (VmHWM)
less the same command's peak over a tiny file (the constant), per MB of input: the
promise is that of one large answer, at most 4 (docs/reliability.md). Every step of the
file must reach the run, so a figure is never that of a command that skipped the work.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from .common import record

TARGET_PER_MB = 4.0
RANKS = 256
SAMPLE = (
    Path(__file__).parent.parent / "tests" / "data" / "sglang" / "server_info.compact.greedy.json"
)

#: `ingest` in a process that prints its own peak resident size (VmHWM) last; with `before`
#: first, as it was: its pipeline folding request rows into the live aggregates.
_INGEST = (
    "import re, sys; from pathlib import Path; from dspark_obs.cli.main import main\n"
    "if sys.argv[1] == 'before':\n"
    "    import dspark_obs.ingest.server_info as si; build = si.build_pipeline\n"
    "    si.build_pipeline = lambda *a, **k: build(*a, **{**k, 'publish': True})\n"
    "rc = main(['ingest', *sys.argv[2:]])\n"
    r"print(re.search(r'VmHWM:\s+(\d+)', Path('/proc/self/status').read_text()).group(1))"
    "\nsys.exit(rc)"
)


def many_ranks(path: Path, ranks: int, per_rank: int) -> int:
    """A `ranks`-rank answer at `path`, each rank the sample's first `per_rank` records; its
    steps."""
    info = json.loads(SAMPLE.read_text())["internal_states"][0]["dspark_info_record"]
    rank = {**info, "records": info["records"][:per_rank]}
    path.write_text(json.dumps({"internal_states": [{"dspark_info_record": rank}] * ranks}))
    return ranks * len(rank["records"])


def _peak_mb(arm: str, path: Path, steps: int, out: Path) -> float:
    proc = subprocess.run(
        [sys.executable, "-c", _INGEST, arm, str(path), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ingest ({arm}) failed: {proc.stderr[-2000:]}")
    stored = json.loads((out / "run.json").read_text())["steps"]
    if stored != steps:
        raise RuntimeError(f"ingest ({arm}) stored {stored} of {steps} steps")
    return int(proc.stdout.split()[-1]) / 1024


def run(quick: bool) -> list[dict]:
    per_rank, repeats = (28, 1) if quick else (285, 2)
    peaks: dict[str, list[float]] = {"before": [], "after": []}
    constant: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tiny, large = work / "tiny.json", work / "large.json"
        tiny_steps = many_ranks(tiny, 1, 4)
        steps = many_ranks(large, RANKS, per_rank)
        mb = large.stat().st_size / 2**20
        for arm in peaks:
            constant[arm] = _peak_mb(arm, tiny, tiny_steps, work / f"tiny-{arm}")
        for i in range(repeats):
            for arm in ("after", "before") if i % 2 == 0 else ("before", "after"):
                peaks[arm].append(_peak_mb(arm, large, steps, work / f"{arm}-{i}"))
    per_mb = {arm: [(p - constant[arm]) / mb for p in v] for arm, v in peaks.items()}
    after, before = (sorted(per_mb[a])[len(per_mb[a]) // 2] for a in ("after", "before"))
    return [
        record(
            "P13_ingest_rss_per_input_mb",
            {"ranks": RANKS, "steps": steps, "input_mb": round(mb, 1)},
            "MB_rss_per_MB_input",
            per_mb["after"],
            1.0,
            target=TARGET_PER_MB,
            peak_rss_mb=[round(p, 1) for p in peaks["after"]],
            constant_rss_mb=round(constant["after"], 1),
            before_per_mb=round(before, 2),
            before_peak_rss_mb=[round(p, 1) for p in peaks["before"]],
            before_constant_rss_mb=round(constant["before"], 1),
            ratio=round(before / after, 2) if after > 0 else None,
        )
    ]


if __name__ == "__main__":
    from .common import run_alone

    run_alone(run)
