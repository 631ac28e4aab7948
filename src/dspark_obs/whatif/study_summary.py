"""The what-if study's records summarised: errors, coverage and the noise floor per cell.

Per world, policy and level the errors of predicted tokens/s over the seeds
(`summarize_whatif_study`), per world and scope the share within the target and the
verdict (`study_totals`), the real runs' own noise (`study_noise`), and each as a
Markdown table.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl

#: `1.96 * sqrt(2)`: a 95 % band on the difference of two runs with one standard error each.
Z95_2 = 1.96 * 2**0.5

#: The issue's targets: relative error of predicted tokens/s, interval coverage, and the
#: run's own policy reproduced.
TARGET_ERROR = 0.02
TARGET_COVERAGE = 0.95
TARGET_OWN = 0.005
TARGET_SEEDS = 10


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


def study_report(records: list[dict]) -> dict:
    """The summary, totals and noise of the study's records, as `--json` prints them."""
    return {
        "cells": summarize_whatif_study(records),
        "totals": study_totals(records),
        "noise": study_noise(records),
    }


def format_report(report: dict, *, as_json: bool) -> str:
    """`study_report` as printed: JSON, or the Markdown tables."""
    if as_json:
        return json.dumps(report, indent=1)
    totals = format_totals(report["totals"], report["noise"])
    return format_summary(report["cells"]) + "\n\n" + totals
