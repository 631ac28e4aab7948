"""How well the ceiling estimators did on a stored run, against the shadow twin's truth.

The in-band walks left one row per trimmed block in the `ceilings` table; where
a run has none (an older run, a run ingested from SGLang) the stored steps are
replayed through the walks here, without gathered log-probabilities, so sampled
intervals are wider. The cap-accept shadow twin's `shadow_ceiling` of the same
request-step is the truth; the population model is fitted on the run's
(window, accepted, confidence) rows and compared with the truth's survival.

Per method the aggregate interval is the one for a realised mean: the mean of
`lo` and `hi` widened by 1.96 standard errors of the realised ceilings around
their expectations (`var`); the truth mean should fall inside it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from dspark_obs.store import Run

from .online import CeilingEstimator
from .population import population_estimate

Z95 = 1.959963984540054


def walked_blocks(run: Run) -> pl.DataFrame:
    """The `ceilings` rows of a run, computing them by replay where the run has none."""
    if "ceilings" in run.tables():
        return run.scan("ceilings").collect()
    gamma = int(run.manifest["gamma"])
    estimator = CeilingEstimator(gamma)
    frames = []
    for batch in run.batches():
        estimator.update(batch)
        rows = estimator.take_rows()
        if rows is not None:
            frames.append(rows)
    estimator.close()
    rows = estimator.take_rows()
    if rows is not None:
        frames.append(rows)
    if not frames:
        return pl.DataFrame()
    return pl.concat(frames)


def _method_entry(df: pl.DataFrame, method: str) -> dict:
    part = df.filter(pl.col("method") == method)
    n = part.height
    if n == 0:
        return {"blocks": 0}
    truth = part["truth"]
    has_truth = truth.null_count() == 0
    entry = {
        "blocks": n,
        "lo": part["lo"].mean(),
        "point": part["point"].mean(),
        "hi": part["hi"].mean(),
        "censored_rate": (part["status"] == "censored").mean(),
    }
    se = float(np.sqrt(part["var"].sum())) / n
    entry["interval"] = [entry["lo"] - Z95 * se, entry["hi"] + Z95 * se]
    if method == "greedy":
        entry["mean"] = entry["point"]
        entry["exact_rate"] = (part["status"] == "exact").mean()
    if has_truth:
        t = float(truth.mean())
        entry["truth"] = t
        entry["error"] = entry["point"] / t - 1.0 if t else None
        entry["covered"] = bool(entry["interval"][0] <= t <= entry["interval"][1])
        entry["block_coverage"] = ((part["lo"] <= truth) & (truth <= part["hi"])).mean()
        if method == "greedy":
            exact = part.filter(pl.col("status") == "exact")
            entry["exact_agreement"] = (
                (exact["point"] == exact["truth"]).mean() if exact.height else None
            )
            cens = part.filter(pl.col("status") == "censored")
            entry["censored_never_above_truth"] = bool((cens["lo"] <= cens["truth"]).all())
    return entry


def evaluate(run: Run) -> dict:
    """The `dspark-obs estimate --json` object."""
    gamma = int(run.manifest["gamma"])
    if "requests" not in run.tables():  # walks only (an ingested block-accept JSONL)
        blocks = walked_blocks(run).with_columns(pl.lit(None, pl.Float64).alias("truth"))
        return {
            "run": str(run.path),
            "gamma": gamma,
            "workloads": {
                name: {
                    "truth": None,
                    "greedy": _method_entry(part, "greedy"),
                    "sampled": _method_entry(part, "sampled"),
                    "counts": {
                        "walked": part.height,
                        "censored": int((part["status"] == "censored").sum()),
                    },
                }
                for (name,), part in blocks.sort("workload").group_by(
                    "workload", maintain_order=True
                )
            },
        }
    req = (
        run.requests()
        .select(
            "rank",
            "forward_ct",
            "rid",
            "workload",
            "window",
            "correct_drafts",
            "confidence",
            "shadow_ceiling",
            "ceiling",
        )
        .collect()
    )
    truth_col = pl.coalesce("ceiling", "shadow_ceiling")
    req = req.with_columns(truth_col.alias("truth"))
    blocks = walked_blocks(run)
    if blocks.height:
        blocks = blocks.join(
            req.select("rank", "forward_ct", "rid", "truth"),
            on=["rank", "forward_ct", "rid"],
            how="left",
        )
    out = {"run": str(run.path), "gamma": gamma, "workloads": {}}
    for (name,), part in req.sort("workload").group_by("workload", maintain_order=True):
        walked = blocks.filter(pl.col("workload") == name) if blocks.height else blocks
        trimmed = (part["correct_drafts"] == part["window"]) & (part["window"] < gamma)
        conf = part["confidence"]
        confidence = None if conf.null_count() else conf.to_numpy().reshape(-1, gamma)
        pop = population_estimate(
            part["window"].to_numpy(), part["correct_drafts"].to_numpy(), confidence, gamma
        )
        truth = part["truth"]
        entry = {
            "truth": float(truth.mean()) if truth.null_count() == 0 else None,
            "greedy": _method_entry(walked, "greedy") if walked.height else {"blocks": 0},
            "sampled": _method_entry(walked, "sampled") if walked.height else {"blocks": 0},
            "population": {k: pop[k] for k in ("mean", "survival", "identifiable", "naive_km")},
            "counts": {
                "blocks": part.height,
                "trimmed": int(trimmed.sum()),
                "walked": walked.height,
                "resolved": int((walked["status"] != "censored").sum()) if walked.height else 0,
                "censored": int((walked["status"] == "censored").sum()) if walked.height else 0,
                "skipped": int(trimmed.sum()) - walked.height,
            },
        }
        if entry["truth"] is not None:
            ceil = truth.to_numpy()
            entry["population"]["truth_survival"] = [float((ceil > j).mean()) for j in range(gamma)]
        out["workloads"][name] = entry
    return out
