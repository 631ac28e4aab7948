"""The world study: reference runs over the runtime's worlds and many seeds, each held
to its own truth on both estimate paths (`estimator/study.py`).

`python -m dspark_obs.recording.study --worlds real --seeds 20 --jobs 2 --out F` runs it (one
world and seed per worker process, each one's records appended to F as it finishes);
`--summarize F...` folds recorded seeds into the per-cell table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from ..estimator.study import all_step_means, jsonl_all_step_means, summarize_study
from ..runtime.config import STS_WARMUP_STEPS, RuntimeConfig
from ..runtime.sts_warmup import resolve_sts
from ..store import open_run
from .reference import record_reference_run
from .workers import add_device_argument, in_workers, jsonl_sink, read_records


def _world_seed(
    world: str, seed: int, concurrency: int, steps: int, sts: str, device: str | None
) -> list[dict]:
    """The records of one world and seed (`world_study`)."""
    config = RuntimeConfig(seed=seed, world=world, shadow="cap-accept", concurrency=[concurrency],
                           steps_per_level=steps, device=device, simulated_times=True)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        out, jsonl = Path(tmp) / "run", Path(tmp) / "block_accept.jsonl"
        calibration = resolve_sts(sts, config, STS_WARMUP_STEPS)
        record_reference_run(config, out, calibration, sglang_jsonl=jsonl)
        run = open_run(out)
        paths = {"in-band": all_step_means(run), "jsonl": jsonl_all_step_means(jsonl, run)}
    return [
        {"world": world, "seed": seed, "path": path, "workload": w, "method": m, **entry}
        for path, means in paths.items()
        for (w, m), entry in sorted(means.items())
    ]


def world_study(worlds: list[str], seeds: list[int], *, concurrency: int = 64, steps: int = 200,
                sts: str = "auto", jobs: int = 1, sink=None,
                device: str | None = None) -> list[dict]:  # fmt: skip
    """One record per (world, seed, path, workload, method) of a compact run with a shadow
    twin: `path` is `in-band` (the run's own walks) or `jsonl` (the walk over the
    block-accept JSONL the run wrote, as SGLang's recorder writes it; sampled requests).
    `sts` as `dspark-obs run --sts` takes it (the default fits STS on a warm-up run, as
    a run does); `jobs` worker processes, `sink(records)` called as each seed finishes;
    `device` runs the real world's networks there (`add_device_argument`)."""
    calls = [(w, s, concurrency, steps, sts, device) for w in worlds for s in seeds]
    records = in_workers(_world_seed, calls, jobs, sink)
    records.sort(key=lambda r: (r["world"], r["seed"], r["path"], r["workload"], r["method"]))
    return records


def format_study(rows: list[dict]) -> str:
    """`summarize_study`'s rows as a Markdown table."""
    lines = [
        "| world | path | workload | method | seeds | mean error % | largest % | covered |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['world']} | {r['path']} | {r['workload']} | {r['method']} | {r['seeds']} | "
            f"{100 * r['mean_error']:+.2f} | {100 * r['max_abs_error']:.1f} | {r['coverage']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m dspark_obs.recording.study --worlds real --seeds 20 [--jobs N] [--out F]`."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--worlds", nargs="+", default=["reference"])
    ap.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--steps", type=int, default=200, help="verify steps of each run")
    ap.add_argument("--sts", default="auto", help="auto (a warm-up run), none, or an STS file")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes, one (world, seed) each")
    add_device_argument(ap)
    ap.add_argument("--out", help="append each seed's records here (JSON Lines)")
    ap.add_argument("--summarize", nargs="+", metavar="FILE", help="summarise recorded records")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = ap.parse_args(argv)
    try:
        if args.summarize:
            records = read_records(args.summarize)
        else:
            seeds = list(range(args.first_seed, args.first_seed + args.seeds))
            with jsonl_sink(args.out) as sink:
                records = world_study(args.worlds, seeds, concurrency=args.concurrency,
                                      steps=args.steps, sts=args.sts, jobs=args.jobs,
                                      sink=sink, device=args.device)  # fmt: skip
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = summarize_study(records)
    print(json.dumps(rows, indent=1) if args.json else format_study(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
