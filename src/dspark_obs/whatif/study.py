"""The what-if study: predictions from one compact run held to real runs of each policy.

Per world and seed: a compact run with STS fitted on a warm-up (as `dspark-obs run`
does) and a cap-accept shadow (whose ceilings the prediction ignores, so it rests on
the ceiling estimator alone); `whatif` predicts the other policies from it; then each
policy is run for real with the same seed, traffic and STS. The truth is each run's
measured tokens/s per cell, computed here from its tables (`measured_cells`), not by
`whatif`; the compact run's own measured cells are the truth for the `own` prediction.

The (world, seed) pairs are independent, so `--jobs N` runs them in N worker processes
(each single-threaded, so that N workers use N cores) and appends each pair's records
to `--out` as it finishes. `--summarize FILE...` prints the summary table of recorded
records without running anything.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import polars as pl

from ..outputs import prepare_dir
from ..runs.workers import add_device_argument, in_workers, jsonl_sink, read_records

#: Policies the runtime can run for real, and the configuration change that runs each.
RUNNABLE = {
    "static": {"mode": "static"},
    "sps:scale=0.5": {"budget_scale": 0.5},
    "sps:sts=none": {"sts_temperatures": None},
}

#: What each cell is compared on (the truth has no interval).
COMPARED = ("tokens_per_s", "per_request_tokens_per_s", "mean_accepted", "step_ms")

#: `1.96 * sqrt(2)`: a 95 % band on the difference of two runs with one standard error each.
Z95_2 = 1.96 * 2**0.5

#: The issue's targets: relative error of predicted tokens/s, interval coverage, and the
#: run's own policy reproduced.
TARGET_ERROR = 0.02
TARGET_COVERAGE = 0.95
TARGET_OWN = 0.005
TARGET_SEEDS = 10


def measured_cells(run) -> dict:
    """`{(level, workload): figures}` of a run as measured, from its tables alone.

    tokens/s is the cell's committed tokens over its request-steps' share of step time
    (`T / bs` each; for `all` the level's throughput), per-request tokens/s committed
    tokens over the step time its requests sat through: the definitions `whatif` predicts.
    """
    from ..analysis.load import run_load_level, step_tokens

    steps = step_tokens(run).filter(pl.col("bs") > 0)
    level = run_load_level(run, steps).alias("level")
    steps = steps.select("rank", "forward_ct", "bs", "seconds", level)
    rows = run.requests().join(steps, on=["rank", "forward_ct"]).collect()
    rows = rows.select(
        "level",
        "workload",
        "rid",
        pl.col("acc_len").cast(pl.Float64),
        pl.col("correct_drafts").cast(pl.Float64),
        "seconds",
        (pl.col("seconds") / pl.col("bs")).alias("share"),
    )
    figures = [
        (pl.col("acc_len").sum() / pl.col("share").sum()).alias("tokens_per_s"),
        (pl.col("acc_len").sum() / pl.col("seconds").sum()).alias("per_request_tokens_per_s"),
        pl.col("correct_drafts").mean().alias("mean_accepted"),
        pl.len().alias("request_steps"),
        (pl.col("seconds").mean() * 1e3).alias("step_ms"),
    ]
    whole = (
        rows.group_by("level")
        .agg(*figures[:4])
        .join(
            steps.group_by("level")
            .agg((pl.col("seconds").mean() * 1e3).alias("step_ms"))
            .collect(),
            on="level",
        )
        .join(_standard_errors(rows, ["level"]), on="level")
    )
    out = {(r["level"], "all"): r for r in whole.iter_rows(named=True)}
    parts = rows.group_by("level", "workload").agg(*figures)
    parts = parts.join(_standard_errors(rows, ["level", "workload"]), on=["level", "workload"])
    for r in parts.iter_rows(named=True):
        out[(r["level"], r["workload"])] = r
    return out


def _standard_errors(rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per cell, the standard error of its measured tokens/s (committed over share of step
    time), clustered by request: the sampling noise of one real run's figure, which no
    prediction can be held to more closely."""
    per_request = rows.group_by(*keys, "rid").agg(pl.col("acc_len").sum(), pl.col("share").sum())
    rate = (pl.col("acc_len").sum() / pl.col("share").sum()).over(keys)
    resid = (pl.col("acc_len") - rate * pl.col("share")) ** 2
    return per_request.group_by(keys).agg(
        (resid.sum().sqrt() / pl.col("share").sum()).alias("tokens_per_s_se")
    )


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
    from ..runs import record_reference_run
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


def relative_errors(records: list[dict], key: str = "tokens_per_s_predicted") -> np.ndarray:
    """Predicted (`key`) over real tokens/s, minus one, per record."""
    p = np.array([r.get(key, np.nan) for r in records], np.float64)
    t = np.array([r["tokens_per_s_real"] for r in records], np.float64)
    return p / t - 1


def summarize_whatif_study(records: list[dict]) -> list[dict]:
    """Per world, policy and level: the whole batch's (`all`) and the workloads' errors of
    predicted tokens/s over the seeds.

    Per cell (level, workload) the errors of every seed; `*_seed_max` is the largest
    |error| of any seed (the 2 % target judged per seed), `*_mean` the largest |mean over
    seeds| (the bias: sampling averages out over seeds, a model error does not) and
    `*_mean_exact` the same cell's with the shadow's exact ceilings in place of the
    estimator's (what of the bias is not the ceiling estimator's), `*_sd`
    the largest spread between seeds; `*_within` the share of (seed, cell) within 2 %,
    `*_coverage` the share whose interval holds the real value.

    The same records in any order give the same figures to the bit: they are sorted, and
    grouped in that order, so that sums over seeds and the worst of tied workloads do not
    follow the order in which the study's workers finished.
    """
    if not records:
        return []
    records = sorted(records, key=lambda r: (r["world"], r["policy"], r["level"],
                                             r["workload"], r["seed"]))  # fmt: skip
    df = pl.DataFrame(records).with_columns(
        pl.Series("err", relative_errors(records)),
        pl.Series("err_exact", relative_errors(records, "tokens_per_s_exact_ceilings")),
        pl.col("tokens_per_s_real")
        .is_between(pl.col("tokens_per_s_lo"), pl.col("tokens_per_s_hi"))
        .alias("covered"),
        pl.when(pl.col("workload") == "all")
        .then(pl.lit("all"))
        .otherwise(pl.lit("wl"))
        .alias("scope"),
    )
    keys = ["world", "policy", "level"]
    cells = df.group_by(*keys, "scope", "workload", maintain_order=True).agg(
        pl.col("err").abs().max().alias("seed_max"),
        pl.col("err").mean().alias("mean"),
        pl.col("err_exact").mean().alias("mean_exact"),
        pl.col("err").std(ddof=1).alias("sd"),
        (pl.col("err").abs() <= TARGET_ERROR).sum().alias("within"),
        pl.col("covered").sum().alias("covered"),
        pl.len().alias("n"),
        pl.col("seed").n_unique().alias("seeds"),
        pl.col("request_steps").mean().alias("request_steps"),
    )
    per_scope = cells.group_by(*keys, "scope", maintain_order=True).agg(
        pl.col("seeds").max(),
        pl.col("seed_max").max(),
        pl.col("mean").sort_by(pl.col("mean").abs()).last(),
        pl.col("mean_exact").sort_by(pl.col("mean").abs()).last(),
        pl.col("sd").max(),
        (pl.col("within").sum() / pl.col("n").sum()).alias("within"),
        (pl.col("covered").sum() / pl.col("n").sum()).alias("coverage"),
        pl.col("workload").sort_by(pl.col("mean").abs()).last().alias("worst"),
        pl.col("request_steps").min(),
    )
    out = []
    whole = per_scope.filter(pl.col("scope") == "all")
    parts = per_scope.filter(pl.col("scope") == "wl").drop("scope", "seeds")
    joined = whole.drop("scope", "worst", "request_steps").join(
        parts, on=keys, how="left", suffix="_wl"
    )
    for r in joined.sort(keys).iter_rows(named=True):
        out.append({
            "world": r["world"], "policy": r["policy"], "level": r["level"], "seeds": r["seeds"],
            "all_seed_max": r["seed_max"], "all_mean": r["mean"], "all_sd": r["sd"],
            "all_mean_exact": r["mean_exact"], "wl_mean_exact": r["mean_exact_wl"],
            "all_within": r["within"], "all_coverage": r["coverage"],
            "wl_seed_max": r["seed_max_wl"], "wl_mean": r["mean_wl"], "wl_sd": r["sd_wl"],
            "wl_within": r["within_wl"], "wl_coverage": r["coverage_wl"],
            "wl_worst": r["worst"], "wl_min_request_steps": r["request_steps"],
        })  # fmt: skip
    return out


def study_totals(records: list[dict]) -> list[dict]:
    """Per world and scope (`all`, the workloads; `own` left out): the share of (seed,
    cell) within 2 % and covered, with the closed-loop correction and on the request-steps
    as recorded (`*_same_steps`, the prediction before it), and the noise floor: the
    median over cells of the real run's own standard error (`tokens_per_s_real_se`) over
    its value, and the share of cells where `1.96 * sqrt(2)` of it is under 2 % (where a
    prediction as good as a second run could be told within 2 % from one that is not).

    The issue's verdict on the same scope: `seeds` (the fewest any cell has), `mean_within`
    (the share of cells, a (policy, level, workload) each, whose error averaged over the
    seeds is within 2 %: sampling averages out over seeds, a bias does not), `worst_mean`
    (the largest such |error|), `own_max` (the largest |error| of the run's own policy over
    every cell and seed of the world) and `target_met`: at least `TARGET_SEEDS` seeds, every
    cell's seed mean within 2 %, at least 95 % of (seed, cell) covered, own within 0.5 %."""
    # records of a study recorded before these keys have neither
    rows = [r for r in records if r["policy"] != "own" and "tokens_per_s_real_se" in r]
    if not rows:
        return []
    own = [r for r in records if r["policy"] == "own"]
    own_max = pl.DataFrame({"world": [r["world"] for r in own],
                            "e": np.abs(relative_errors(own))}) if own else None  # fmt: skip
    df = pl.DataFrame(rows).with_columns(
        pl.Series("err", relative_errors(rows)),
        pl.Series("err_same", relative_errors(rows, "tokens_per_s_same_steps")),
        (pl.col("tokens_per_s_real_se") / pl.col("tokens_per_s_real")).alias("noise"),
        pl.when(pl.col("workload") == "all").then(pl.lit("all")).otherwise(pl.lit("wl"))
        .alias("scope"),
    )  # fmt: skip
    real = pl.col("tokens_per_s_real")
    out = df.group_by("world", "scope").agg(
        pl.len().alias("cells"),
        (pl.col("err").abs() <= TARGET_ERROR).mean().alias("within"),
        (pl.col("err_same").abs() <= TARGET_ERROR).mean().alias("within_same_steps"),
        real.is_between(pl.col("tokens_per_s_lo"), pl.col("tokens_per_s_hi")).mean()
        .alias("coverage"),
        real.is_between(pl.col("tokens_per_s_lo_same_steps"), pl.col("tokens_per_s_hi_same_steps"))
        .mean().alias("coverage_same_steps"),
        pl.col("noise").median().alias("noise_median"),
        (Z95_2 * pl.col("noise") < TARGET_ERROR).mean().alias("decidable"),
    )  # fmt: skip
    cells = df.group_by("world", "scope", "policy", "level", "workload").agg(
        pl.col("err").mean().alias("mean"), pl.col("seed").n_unique().alias("seeds")
    )
    verdict = cells.group_by("world", "scope").agg(
        pl.col("seeds").min(),
        (pl.col("mean").abs() <= TARGET_ERROR).mean().alias("mean_within"),
        pl.col("mean").abs().max().alias("worst_mean"),
    )
    out = out.join(verdict, on=["world", "scope"])
    if own_max is None:
        out = out.with_columns(pl.lit(None, pl.Float64).alias("own_max"))
    else:
        out = out.join(own_max.group_by("world").agg(pl.col("e").max().alias("own_max")),
                       on="world", how="left")  # fmt: skip
    out = out.with_columns(
        (
            (pl.col("seeds") >= TARGET_SEEDS)
            & (pl.col("mean_within") == 1.0)
            & (pl.col("coverage") >= TARGET_COVERAGE)
            & (pl.col("own_max").fill_null(1.0) <= TARGET_OWN)
        ).alias("target_met")
    )
    return out.sort("world", "scope").to_dicts()


def study_noise(records: list[dict]) -> list[dict]:
    """Per world, level and scope: the median and largest relative standard error of the
    real runs' cells (the noise floor of the comparison), with the levels' steps."""
    # records of a study recorded before these keys have neither
    rows = [r for r in records if r["policy"] != "own" and "tokens_per_s_real_se" in r]
    if not rows:
        return []
    df = pl.DataFrame(rows).with_columns(
        (pl.col("tokens_per_s_real_se") / pl.col("tokens_per_s_real")).alias("noise"),
        pl.when(pl.col("workload") == "all").then(pl.lit("all")).otherwise(pl.lit("wl"))
        .alias("scope"),
    )  # fmt: skip
    out = df.group_by("world", "level", "scope").agg(
        pl.col("steps_per_level").max().alias("steps"),
        pl.col("noise").median().alias("noise_median"),
        pl.col("noise").max().alias("noise_max"),
    )
    return out.sort("world", "level", "scope").to_dicts()


def format_summary(rows: list[dict]) -> str:
    """The summary as a Markdown table, errors in percent (`exact`: the seed-mean error with
    the shadow's exact ceilings)."""

    def pct(x: float | None, sign: str = "") -> str:
        return "–" if x is None or x != x else f"{100 * x:{sign}.1f}"

    head = (
        "| world | policy | bs | all: seed max / mean (exact) / sd % | within 2 % / covered | "
        "workloads: seed max / worst mean (exact) / sd % | within 2 % / covered |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"| {r['world']} | {r['policy']} | {r['level']} | {pct(r['all_seed_max'])} / "
            f"{pct(r['all_mean'], '+')} ({pct(r['all_mean_exact'], '+')}) / {pct(r['all_sd'])} | "
            f"{pct(r['all_within'])} / {pct(r['all_coverage'])} | {pct(r['wl_seed_max'])} / "
            f"{pct(r['wl_mean'], '+')} ({pct(r['wl_mean_exact'], '+')}, {r['wl_worst']}) / "
            f"{pct(r['wl_sd'])} | {pct(r['wl_within'])} / {pct(r['wl_coverage'])} |"
        )
    return "\n".join(lines)


def format_totals(totals: list[dict], noise: list[dict]) -> str:
    """`study_totals` and `study_noise` as Markdown tables (percent)."""

    def pct(x) -> str:
        return "–" if x is None or x != x else f"{100 * x:.1f}"

    lines = [
        "| world | scope | cells | within 2 % (recorded steps) | covered (recorded steps) | "
        "noise: median SE % | decidable % | seeds | seed means within 2 % | worst seed mean % "
        "| own max % | target met |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in totals:
        lines.append(
            f"| {r['world']} | {r['scope']} | {r['cells']} | {pct(r['within'])} "
            f"({pct(r['within_same_steps'])}) | {pct(r['coverage'])} "
            f"({pct(r['coverage_same_steps'])}) | {pct(r['noise_median'])} | "
            f"{pct(r['decidable'])} | {r['seeds']} | {pct(r['mean_within'])} | "
            f"{pct(r['worst_mean'])} | {pct(r['own_max'])} | "
            f"{'yes' if r['target_met'] else 'no'} |"
        )
    lines += [
        "",
        "| world | bs | steps | scope | SE % median / max |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    for r in noise:
        lines.append(
            f"| {r['world']} | {r['level']} | {r['steps']} | {r['scope']} | "
            f"{pct(r['noise_median'])} / {pct(r['noise_max'])} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m dspark_obs.whatif.study --worlds reference --seeds 10 [--steps N] [--jobs N]`."""
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
    args = ap.parse_args(argv)
    if args.summarize:
        try:
            records = read_records(args.summarize)
        except (OSError, ValueError) as exc:
            print(f"error: cannot read study records: {exc}", file=sys.stderr)
            return 2
    else:
        try:
            concurrency = tuple(int(c) for c in args.concurrency.split(","))
        except ValueError:
            print(
                f"error: --concurrency {args.concurrency!r}: comma-separated integers",
                file=sys.stderr,
            )
            return 2
        seeds = list(range(args.first_seed, args.first_seed + args.seeds))
        try:
            if args.keep:  # a planted link there would carry every pair's runs away
                prepare_dir(args.keep, "--keep")
            with jsonl_sink(args.out) as sink:
                if args.repredict:
                    records = repredict(args.repredict, jobs=args.jobs, sink=sink)
                else:
                    records = whatif_study(args.worlds, seeds, concurrency=concurrency,
                                           steps=args.steps, request_steps=args.request_steps,
                                           jobs=args.jobs, sink=sink, keep=args.keep,
                                           device=args.device)  # fmt: skip
        except (OSError, ValueError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    rows = summarize_whatif_study(records)
    totals, noise = study_totals(records), study_noise(records)
    if args.json:
        print(json.dumps({"cells": rows, "totals": totals, "noise": noise}, indent=1))
    else:
        print(format_summary(rows) + "\n\n" + format_totals(totals, noise))
    return 0


if __name__ == "__main__":
    sys.exit(main())
