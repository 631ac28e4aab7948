"""The what-if study: predictions from one compact run held to real runs of each policy.

Per world and seed: a compact run with STS fitted on a warm-up (as `dspark-obs run`
does) and a cap-accept shadow (whose ceilings the prediction ignores, so it rests on
the ceiling estimator alone); `whatif` predicts the other policies from it; then each
policy is run for real with the same seed, traffic and STS, and its own cells (the
`own` policy of that run, which reproduces its measured figures) are the truth.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

from ..runs import record_reference_run
from ..runtime.config import STS_WARMUP_STEPS, RuntimeConfig
from ..runtime.sts_warmup import resolve_sts
from ..store import open_run
from .predict import whatif

#: Policies the runtime can run for real, and the configuration change that runs each.
RUNNABLE = {
    "static": {"mode": "static"},
    "sps:scale=0.5": {"budget_scale": 0.5},
    "sps:sts=none": {"sts_temperatures": None},
}

#: What each cell is compared on.
COMPARED = ("tokens_per_s", "per_request_tokens_per_s", "mean_accepted", "step_ms")


def _cells(report: dict) -> dict:
    return {(c["policy"], c["level"], c["workload"]): c for c in report["cells"]}


def whatif_study(
    worlds: list[str],
    seeds: list[int],
    *,
    policies: tuple[str, ...] = tuple(RUNNABLE),
    concurrency: tuple[int, ...] = (1, 8, 32, 128),
    steps: int = 200,
) -> list[dict]:
    """One record per (world, seed, policy, level, workload): predicted figures with their
    intervals beside the real run's, and the `own` prediction of the compact run beside
    its measured figures (`policy` `own`)."""
    records = []
    for world in worlds:
        for seed in seeds:
            base = RuntimeConfig(seed=seed, world=world, shadow="cap-accept",
                                 concurrency=list(concurrency), steps_per_level=steps)  # fmt: skip
            sts = resolve_sts("auto", base, STS_WARMUP_STEPS)
            with tempfile.TemporaryDirectory() as tmp:
                record_reference_run(base, Path(tmp) / "compact", sts)
                compact = open_run(Path(tmp) / "compact")
                predicted = _cells(whatif(compact, ["own", *policies], use_shadow=False))
                truth = {"own": _cells(whatif(compact, ["own"]))}
                for name in policies:
                    change = dict(RUNNABLE[name])
                    config = dataclasses.replace(base, shadow=None, **change)
                    keep = sts if "sts_temperatures" not in change else None
                    out = Path(tmp) / name.replace(":", "_").replace("=", "_")
                    record_reference_run(config, out, keep)
                    truth[name] = _cells(whatif(open_run(out), ["own"]))
            for (policy, level, workload), p in predicted.items():
                real = truth[policy].get(("own", level, workload))
                if real is None:
                    continue
                rec = {"world": world, "seed": seed, "policy": policy, "level": level,
                       "workload": workload}  # fmt: skip
                for key in COMPARED:
                    rec[f"{key}_predicted"] = p[key]
                    rec[f"{key}_real"] = real[key]
                for key in ("tokens_per_s", "per_request_tokens_per_s"):
                    rec[f"{key}_lo"], rec[f"{key}_hi"] = p[f"{key}_lo"], p[f"{key}_hi"]
                records.append(rec)
    return records


def summarize_whatif_study(records: list[dict]) -> list[dict]:
    """Per world and policy, over every (seed, level, workload) cell: the mean and largest
    absolute error of predicted tokens/s, the share of cells within 2 %, and the share
    whose interval covers the real value (the `all` cells, whole batches, apart)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        scope = "all" if r["workload"] == "all" else "workload"
        groups.setdefault((r["world"], r["policy"], scope), []).append(r)
    out = []
    for (world, policy, scope), rows in sorted(groups.items()):
        err = [abs(r["tokens_per_s_predicted"] / r["tokens_per_s_real"] - 1) for r in rows]
        covered = [r["tokens_per_s_lo"] <= r["tokens_per_s_real"] <= r["tokens_per_s_hi"]
                   for r in rows]  # fmt: skip
        out.append({"world": world, "policy": policy, "cells": scope, "n": len(rows),
                    "mean_abs_error": sum(err) / len(err), "max_abs_error": max(err),
                    "within_2pct": sum(e <= 0.02 for e in err) / len(err),
                    "coverage": sum(covered) / len(covered)})  # fmt: skip
    return out


def main() -> None:
    """`python -m dspark_obs.whatif.study --worlds reference --seeds 10 [--steps N]`."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--worlds", nargs="+", default=["reference"])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", help="also write every record here (JSON)")
    args = ap.parse_args()
    records = whatif_study(args.worlds, list(range(args.seeds)), steps=args.steps)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(records, f)
    print(json.dumps(summarize_whatif_study(records), indent=1))


if __name__ == "__main__":
    main()
