"""P2: per-step ceiling estimator update (walks + population model) at B = 256, gamma 7.

Steps come from a compact run whose requests are half greedy, half sampled, so
both walks and the confidence-stratified population model do their real work;
the sampled walk gathers from recorded verify distributions, as in band.

The baseline is the same work done the SGLang way
(`baselines.SGLangStyleCeilingEstimator`) on the same steps and verify
distributions: SGLang's block-accept walk of sampled requests, plus greedy
walks and the population model's counts, per request in Python loops. SGLang's
own estimator alone (sampled walk only) is timed too, for reference. Before
timing, both run once; the per-block `lo` of every sampled block both resolved
is compared (ours counts accepted drafts, SGLang's tokens: `lo + 1`), and so are
the population model's at-risk and rejection counts.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from dspark_obs.estimator.ceiling_estimator import CeilingEstimator

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime

from .baselines import SGLangStyleBlockAccept, SGLangStyleCeilingEstimator
from .common import record, repeat_pair, with_baseline

TARGET_US = 100.0
RATIO_TARGET = 10.0


def check_blocks(ours: CeilingEstimator, base: SGLangStyleBlockAccept) -> dict:
    """Per-block `lo` of sampled blocks resolved by both: ours + 1 == SGLang-style."""
    rows = ours.take_rows()
    if rows is None:
        return {"blocks_compared": 0}
    resolved = rows.filter((pl.col("method") == "sampled") & (pl.col("status") == "resolved"))
    lo_of = base.lo_of or {}
    diffs = [
        lo + 1.0 - lo_of[(rid, fct)]
        for rid, fct, lo in resolved.select("rid", "forward_ct", "lo").iter_rows()
        if (rid, fct) in lo_of
    ]
    worst = float(np.max(np.abs(diffs))) if diffs else 0.0
    if worst > 1e-6:
        raise AssertionError(f"per-block lo differs from the SGLang-style walk by up to {worst}")
    return {
        "sampled_blocks_resolved_ours": resolved.height,
        "sampled_blocks_baseline": base.closed,
        "blocks_compared": len(diffs),
        "lo_max_abs_diff": worst,
    }


def run(quick: bool) -> list[dict]:
    steps = 150 if quick else 1000
    config = RuntimeConfig(mode="compact", concurrency=[256], steps_per_level=steps, seed=2)
    runtime = DSparkRuntime(config)
    data, verified = [], []
    for batch in runtime.run():
        data.append(batch)
        verified.append(runtime._verified.copy())  # the runtime reuses its table each step

    def feed() -> CeilingEstimator:
        # as a pipeline builds it: the run's cost table prices the cost of trimming
        est = CeilingEstimator(
            7,
            step_cost=lambda mode, rank: config.cost_table,
            capture_tiers=tuple(config.capture_tiers),
        )
        for batch, p in zip(data, verified, strict=True):
            est.update(batch, lambda r, j, t, p=p: np.log(p[r, j, t]))
        return est

    def baseline() -> SGLangStyleCeilingEstimator:
        base = SGLangStyleCeilingEstimator(7)
        for batch, p in zip(data, verified, strict=True):
            base.update(batch, p)
        return base

    def sglang_only() -> SGLangStyleBlockAccept:
        base = SGLangStyleBlockAccept(7)
        for batch, p in zip(data, verified, strict=True):
            base.update(batch, p)
        return base

    est, base = feed(), SGLangStyleCeilingEstimator(7)
    base.lo_of = {}
    for batch, p in zip(data, verified, strict=True):
        base.update(batch, p)
    est.close()
    base.close()
    checked = check_blocks(est, base)
    ours_km = (int(est.population._n0.sum()), int(est.population._d0.sum()))
    base_km = tuple(sum(c[k] for c in base.km.values()) for k in (0, 1))
    if ours_km != base_km:
        raise AssertionError(f"population counts differ: ours {ours_km}, baseline {base_km}")
    checked["population_at_risk_and_rejected"] = ours_km

    times, base_times = repeat_pair(feed, baseline, 1 if quick else 7, 1 if quick else 7)
    _, sglang_times = repeat_pair(feed, sglang_only, 1, 1 if quick else 7)
    rec = record(
        "P2_estimator_update",
        {"bs": 256, "gamma": 7, "steps": steps},
        "us_per_step",
        times,
        1e6 / steps,
        target=TARGET_US,
    )
    return [
        with_baseline(
            rec,
            base_times,
            1e6 / steps,
            RATIO_TARGET,
            baseline="the same work the SGLang way: SGLang's block-accept walker (per request "
            "per step, a dict of pending blocks keyed by (rid, block forward_ct), offsets "
            "walked in Python with math.exp, online lo/hi means), plus greedy walks and the "
            "population model's counts per request and position in Python loops",
            sglang_only_median=float(np.median(sglang_times)) * 1e6 / steps,
            sglang_only_note="SGLang's own estimator alone (sampled walk only), for reference",
            baseline_check=checked,
        )
    ]
