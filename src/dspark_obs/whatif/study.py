"""The what-if study: predictions from one compact run held to real runs of each policy.

Per world and seed: a compact run with STS fitted on a warm-up (as `dspark-obs run`
does) and a cap-accept shadow (whose ceilings the prediction ignores, so it rests on
the ceiling estimator alone); `whatif` predicts the other policies from it; then each
policy is run for real with the same seed, traffic and STS. The truth is each run's
measured tokens/s per cell, computed from its tables (`study_truth.measured_cells`), not
by `whatif`; the compact run's own measured cells are the truth for the `own` prediction.

The (world, seed) pairs are independent, so `--jobs N` runs them in N worker processes
(each single-threaded, so that N workers use N cores) and appends each pair's records
to `--out` as it finishes. `--summarize FILE...` prints the summary table of recorded
records without running anything (`study_summary.py`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from ..outputs import prepare_dir
from ..recording.workers import add_device_argument, in_workers, jsonl_sink, read_records
from .study_summary import format_report, study_report
from .study_truth import measured_cells

#: Policies the runtime can run for real, and the configuration change that runs each.
RUNNABLE = {
    "static": {"mode": "static"},
    "sps:scale=0.5": {"budget_scale": 0.5},
    "sps:sts=none": {"sts_temperatures": None},
}

#: What each cell is compared on (the truth has no interval).
COMPARED = ("tokens_per_s", "per_request_tokens_per_s", "mean_accepted", "step_ms")


def level_steps(concurrency, steps: int, request_steps: int | None) -> list[int]:
    """Steps at each level: `steps`, or enough for `request_steps` request-steps where that
    is more (a level of batch 1 then holds as many request-steps as one of 128)."""
    return [max(steps, -(-(request_steps or 0) // c)) for c in concurrency]


#: The file of a kept pair's directory that names what it holds (`--keep`, `--repredict`).
PAIR_FILE = "pair.json"


def _run_name(policy: str) -> str:
    """A real run's directory name in a pair's directory."""
    return policy.replace(":", "_").replace("=", "_")


def _record_pair(
    world: str, seed: int, policies: tuple[str, ...], concurrency, steps: int, request_steps,
    root: Path, device: str | None = None,
) -> None:  # fmt: skip
    """Run one (world, seed) into `root`: the compact run (with its shadow), each policy's
    real run, and `PAIR_FILE` naming them, written last (a directory without it is a pair
    that did not finish)."""
    from ..recording import record_reference_run
    from ..runtime.config import STS_WARMUP_STEPS, RuntimeConfig
    from ..runtime.sts_warmup import resolve_sts

    per_level = level_steps(concurrency, steps, request_steps)
    base = RuntimeConfig(seed=seed, world=world, shadow="cap-accept", concurrency=list(concurrency),
                         steps_per_level=steps, level_steps=per_level, device=device,
                         simulated_times=True)  # fmt: skip
    sts = resolve_sts("auto", base, STS_WARMUP_STEPS)
    record_reference_run(base, root / "compact", sts)
    for name in policies:
        change = dict(RUNNABLE[name])
        config = dataclasses.replace(base, shadow=None, **change)
        keep = sts if "sts_temperatures" not in change else None
        record_reference_run(config, root / _run_name(name), keep)
    meta = {"world": world, "seed": seed, "policies": list(policies),
            "concurrency": list(concurrency), "steps": steps, "level_steps": per_level}  # fmt: skip
    (root / PAIR_FILE).write_text(json.dumps(meta), encoding="utf-8")


def _pair_records(root: Path) -> list:
    """The records of one recorded (world, seed) in `root` (`_record_pair`): the
    predictions from its compact run held to the real runs it holds."""
    from ..store import open_run
    from .predict import whatif

    meta = json.loads((root / PAIR_FILE).read_text(encoding="utf-8"))
    world, seed, policies = meta["world"], meta["seed"], tuple(meta["policies"])
    concurrency, per_level = meta["concurrency"], meta["level_steps"]
    compact = open_run(root / "compact")
    report = whatif(compact, ["own", *policies], use_shadow=False, same_steps=policies)
    predicted = {(c["policy"], c["level"], c["workload"]): c for c in report["cells"]}
    # the same without the closed-loop correction: the prediction before it
    same = {(c["policy"], c["level"], c["workload"]): c for c in report["same_steps_cells"]}
    # the same with the shadow's ceilings: what is left of an error is not the estimator's
    exact = {
        (c["policy"], c["level"], c["workload"]): c["tokens_per_s"]
        for c in whatif(compact, list(policies), use_shadow=True)["cells"]
    }
    truth = {"own": measured_cells(compact)}
    for name in policies:
        truth[name] = measured_cells(open_run(root / _run_name(name)))
    records = []
    for (policy, level, workload), p in predicted.items():
        real = truth[policy].get((level, workload))
        if real is None:
            continue
        rec = {"world": world, "seed": seed, "policy": policy, "level": level,
               "steps_per_level": per_level[concurrency.index(level)]
               if level in concurrency else meta["steps"],
               "workload": workload, "request_steps": p["request_steps"]}  # fmt: skip
        for key in COMPARED:
            rec[f"{key}_predicted"] = p[key]
            rec[f"{key}_real"] = real[key]
        for key in ("tokens_per_s", "per_request_tokens_per_s"):
            rec[f"{key}_lo"], rec[f"{key}_hi"] = p[f"{key}_lo"], p[f"{key}_hi"]
        rec["tokens_per_s_exact_ceilings"] = exact.get((policy, level, workload), p["tokens_per_s"])
        rec["request_steps_real"] = real["request_steps"]
        rec["tokens_per_s_real_se"] = real["tokens_per_s_se"]
        before = same.get((policy, level, workload), p)
        for key in ("tokens_per_s", "tokens_per_s_lo", "tokens_per_s_hi"):
            rec[f"{key}_same_steps"] = before[key]
        records.append(rec)
    return records


def pair_directory(keep: str | Path, world: str, seed: int) -> Path:
    """Where `--keep DIR` keeps one (world, seed)."""
    return Path(keep) / f"{world}-seed{seed}"


def _pair(
    world: str, seed: int, policies: tuple[str, ...], concurrency, steps: int, request_steps=None,
    keep: str | None = None, device: str | None = None,
) -> list:  # fmt: skip
    """The records of one (world, seed): the predictions and the real runs they are held to;
    the runs are kept under `keep` (`pair_directory`) where given, else thrown away."""
    if keep is not None:
        root = pair_directory(keep, world, seed)
        if root.exists():
            raise ValueError(f"{root} exists: --keep needs a directory without this pair")
        root.mkdir(parents=True)
        _record_pair(world, seed, policies, concurrency, steps, request_steps, root, device)
        return _pair_records(root)
    with tempfile.TemporaryDirectory() as tmp:
        _record_pair(world, seed, policies, concurrency, steps, request_steps, Path(tmp), device)
        return _pair_records(Path(tmp))


def kept_pairs(keep: str | Path) -> list[Path]:
    """The finished pairs under a `--keep` directory (those with their `PAIR_FILE`), sorted;
    ValueError where there are none."""
    found = sorted(p.parent for p in Path(keep).glob(f"*/{PAIR_FILE}"))
    if not found:
        raise ValueError(f"{keep}: no kept pairs (directories holding {PAIR_FILE})")
    return found


def whatif_study(
    worlds: list[str],
    seeds: list[int],
    *,
    policies: tuple[str, ...] = tuple(RUNNABLE),
    concurrency: tuple[int, ...] = (1, 8, 32, 128),
    steps: int = 200,
    request_steps: int | None = None,
    jobs: int = 1,
    sink=None,
    keep: str | None = None,
    device: str | None = None,
) -> list[dict]:
    """One record per (world, seed, policy, level, workload): predicted figures with their
    intervals beside the real run's (`policy` `own`: the compact run's own prediction
    beside its measured figures). `sink(records)` is called as each pair finishes;
    `request_steps` lengthens the levels of small batches (`level_steps`); `keep` keeps
    every pair's runs there (`pair_directory`), for `repredict`; `device` runs the real
    world's networks there (`runs.workers.add_device_argument`)."""
    pairs = [(w, s, tuple(policies), tuple(concurrency), steps, request_steps, keep, device)
             for w in worlds for s in seeds]  # fmt: skip
    return _in_workers(_pair, pairs, jobs, sink)


def repredict(keep: str | Path, *, jobs: int = 1, sink=None) -> list[dict]:
    """The study's records again from the runs a `keep` directory holds, with the code as it
    is now: a change to the prediction is held to the same real runs without running them."""
    return _in_workers(_pair_records, [(p,) for p in kept_pairs(keep)], jobs, sink)


def _in_workers(fn, calls: list[tuple], jobs: int, sink) -> list[dict]:
    records = in_workers(fn, calls, jobs, sink)
    records.sort(key=lambda r: (r["world"], r["seed"], r["policy"], r["level"], r["workload"]))
    return records


def main(argv: list[str] | None = None) -> int:
    """`python -m dspark_obs.whatif.study --worlds reference --seeds 10 [--steps N] [--jobs N]`."""
    args = _parser().parse_args(argv)
    try:
        records = _records(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_report(study_report(records), as_json=args.json))
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--worlds", nargs="+", default=["reference"])
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=200, help="steps per concurrency level")
    ap.add_argument(
        "--request-steps",
        type=int,
        help="at least this many request-steps per level (more steps at small batches)",
    )
    ap.add_argument("--concurrency", default="1,8,32,128")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes, one (world, seed) each")
    add_device_argument(ap)
    ap.add_argument("--out", help="append each pair's records here (JSON Lines)")
    ap.add_argument("--keep", metavar="DIR", help="keep every pair's runs under DIR")
    ap.add_argument(
        "--repredict", metavar="DIR", help="predict again from the runs --keep kept in DIR"
    )
    ap.add_argument("--summarize", nargs="+", metavar="FILE", help="summarise recorded records")
    ap.add_argument("--json", action="store_true", help="print the summary as JSON")
    return ap


def _records(args: argparse.Namespace) -> list[dict]:
    """The records the command line asks for: read (`--summarize`), predicted again from
    kept runs (`--repredict`), or run (`whatif_study`)."""
    if args.summarize:
        try:
            return read_records(args.summarize)
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read study records: {exc}") from exc
    try:
        concurrency = tuple(int(c) for c in args.concurrency.split(","))
    except ValueError:
        raise ValueError(f"--concurrency {args.concurrency!r}: comma-separated integers") from None
    if args.keep:  # a planted link there would carry every pair's runs away
        prepare_dir(args.keep, "--keep")
    with jsonl_sink(args.out) as sink:
        if args.repredict:
            return repredict(args.repredict, jobs=args.jobs, sink=sink)
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        return whatif_study(args.worlds, seeds, concurrency=concurrency, steps=args.steps,
                            request_steps=args.request_steps, jobs=args.jobs, sink=sink,
                            keep=args.keep, device=args.device)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
