"""The live cost of trimming (estimator/trim_cost.py) against the post-hoc one (whatif).

A reference run is recorded through a pipeline whose /metrics text is read at the end;
the same run directory is predicted by `whatif` (the run's own policy and static, the
shadow twin ignored as the live path ignores it). The post-hoc cells are per (level,
workload); their sums over levels are what the live counters hold per workload, and the
window gauges (the run is shorter than the window) are the same ratios of those sums.
"""

from __future__ import annotations

import dataclasses
import re
import threading

import numpy as np
import polars as pl
import pytest
from dspark_obs.exporters.collector import Collector

from dspark_obs.domain.cost_table import AdditiveCostTable
from dspark_obs.pipeline import build_pipeline
from dspark_obs.recording import record_reference_run
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.sources.replay import ReplaySource
from dspark_obs.store import open_run
from dspark_obs.whatif.counterfactual_accept import exact_ceiling, tail_shapes
from dspark_obs.whatif.frame_loader import load_run_frame
from dspark_obs.whatif.policies import parse_policy
from dspark_obs.whatif.predict import predict_policy, whatif

BASE = RuntimeConfig(seed=5, concurrency=[4, 48], steps_per_level=60)
_SAMPLE = re.compile(r'^(dspark_trim_\w+)\{workload="(\w+)",mode="([\w-]+)",rank="0"\} (\S+)$')


def _record(tmp, **change) -> tuple[dict, object]:
    held = {}
    out = tmp / "run"
    record_reference_run(
        dataclasses.replace(BASE, **change), out, None, on_pipeline=lambda p: held.update(p=p)
    )
    p = held["p"]
    text = Collector().collect(p.aggregates.snapshot(), p.estimator.snapshot()).decode()
    metrics: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            metrics[(m[1], m[2])] = float(m[4])
    return metrics, open_run(out)


@pytest.fixture(scope="module")
def compact(tmp_path_factory):
    return _record(tmp_path_factory.mktemp("compact"), shadow="cap-accept")


def _posthoc(cells: list[dict]) -> pl.DataFrame:
    """Per workload, over every level: C_o, T_o, and static's T_s and C_s lo / point / hi."""
    cells = pl.DataFrame(cells).filter(pl.col("workload") != "all")
    sums = cells.with_columns(
        (pl.col("mean_committed") * pl.col("request_steps")).alias("c"),
        ((pl.col("mean_accepted_lo") + 1) * pl.col("request_steps")).alias("c_lo"),
        ((pl.col("mean_accepted_hi") + 1) * pl.col("request_steps")).alias("c_hi"),
    ).with_columns((pl.col("c") / pl.col("tokens_per_s")).alias("t"))
    parts = [
        sums.filter(pl.col("policy") == policy)
        .group_by("workload")
        .agg(pl.col("c", "c_lo", "c_hi", "t").sum().name.suffix(suffix))
        for policy, suffix in (("own", "_o"), ("static", "_s"))
    ]
    return parts[0].join(parts[1], on="workload")


def _check(metrics: dict, run) -> int:
    # on the request-steps as recorded, as the cost of trimming is defined (whatif.trim_cost)
    cells = whatif(run, ["own", "static"], use_shadow=False, closed_loop=False)["cells"]
    post = _posthoc(cells)
    for r in post.iter_rows(named=True):
        wl = r["workload"]

        def live(name: str, wl: str = wl) -> float:
            return metrics[(name, wl)]

        counters = {
            "dspark_trim_committed_tokens_total": r["c_o"],
            "dspark_trim_step_seconds_total": r["t_o"],
            "dspark_trim_static_step_seconds_total": r["t_s"],
            "dspark_trim_static_committed_tokens_total": r["c_s"],
            "dspark_trim_static_committed_lower_tokens_total": r["c_lo_s"],
            "dspark_trim_static_committed_upper_tokens_total": r["c_hi_s"],
        }
        for name, want in counters.items():
            assert live(name) == pytest.approx(want, rel=1e-9), (name, wl)
        own, static = r["c_o"] / r["t_o"], r["c_s"] / r["t_s"]
        gauges = {
            "dspark_trim_net_tokens_per_second": own - static,
            "dspark_trim_net_lower_tokens_per_second": own - r["c_hi_s"] / r["t_s"],
            "dspark_trim_net_upper_tokens_per_second": own - r["c_lo_s"] / r["t_s"],
            "dspark_trim_step_time_saved_tokens_per_second": own - r["c_o"] / r["t_s"],
            "dspark_trim_accepted_lost_tokens_per_second": (r["c_o"] - r["c_s"]) / r["t_s"],
        }
        for name, want in gauges.items():
            assert live(name) == pytest.approx(want, rel=1e-9, abs=1e-6), (name, wl)
        # the parts sum to the net, and the net lies in its bounds
        assert live("dspark_trim_step_time_saved_tokens_per_second") + live(
            "dspark_trim_accepted_lost_tokens_per_second"
        ) == pytest.approx(live("dspark_trim_net_tokens_per_second"), abs=1e-6)
        assert (
            live("dspark_trim_net_lower_tokens_per_second")
            <= live("dspark_trim_net_tokens_per_second") + 1e-9
            <= live("dspark_trim_net_upper_tokens_per_second") + 2e-9
        )
    return post.height


def test_live_equals_whatif_trim_cost_on_a_compact_run(compact) -> None:
    metrics, run = compact
    assert _check(metrics, run) == 3
    # trimming happened and walks bracket static: the bounds are a real interval somewhere
    widths = [
        metrics[("dspark_trim_static_committed_upper_tokens_total", wl)]
        - metrics[("dspark_trim_static_committed_lower_tokens_total", wl)]
        for wl in ("arena", "gsm8k", "poetry")
    ]
    assert max(widths) > 0


def test_live_equals_whatif_on_a_cap_accept_run(tmp_path) -> None:
    """cap-accept reveals every ceiling: static's side is exact, walks do not enter it."""
    metrics, run = _record(tmp_path, mode="cap-accept", concurrency=[8], steps_per_level=60)
    assert _check(metrics, run) == 3
    for wl in ("arena", "gsm8k", "poetry"):
        lo, point, hi = (
            metrics[(f"dspark_trim_static_committed{b}_tokens_total", wl)]
            for b in ("_lower", "", "_upper")
        )
        assert lo == point == hi
        assert np.isfinite(point)


def test_without_a_table_the_online_refit_prices_static(compact) -> None:
    """A source that knows no cost table (a replay): the aggregates' refit prices the steps.
    The aggregates learn their refit on a first pass over the run (under the 1,024 timed
    steps of a second refit), so every step of the second is priced with that one refit,
    and whatif with it as the run's table gives the same sums."""
    _, run = compact
    p = build_pipeline(run.gamma)
    steps = list(ReplaySource(str(run.path), speed=0).batches(threading.Event()))
    for batch in steps:
        p.aggregates.update(batch)
    p.aggregates.flush()
    table = p.aggregates.cost_table("compact", 0)
    assert table is not None and len(steps) < 1024
    for batch in steps:
        p.ingest(batch, "replay")
    p.close()
    assert p.aggregates.cost_table("compact", 0).refit is table.refit
    text = Collector().collect(p.aggregates.snapshot(), p.estimator.snapshot()).decode()
    metrics = {(m[1], m[2]): float(m[4]) for m in map(_SAMPLE.match, text.splitlines()) if m}
    frame = load_run_frame(run, use_shadow=False)
    frame.table = table
    exact = exact_ceiling(frame.inputs)
    shapes = tail_shapes(frame.inputs, exact, int(frame.inputs.group.max()) + 1)
    cells = [
        c
        for spec in ("own", "static")
        for c in predict_policy(
            frame, parse_policy(spec, frame.gamma), shapes, exact, closed_loop=False
        )
    ]
    # the replay's walks have no in-band gather, so static's tokens differ from the recorded
    # walks'; the prices are what this test is about
    post = _posthoc(cells)
    for r in post.iter_rows(named=True):
        for name, key in (
            ("dspark_trim_committed_tokens_total", "c_o"),
            ("dspark_trim_step_seconds_total", "t_o"),
            ("dspark_trim_static_step_seconds_total", "t_s"),
        ):
            assert metrics[(name, r["workload"])] == pytest.approx(r[key], rel=1e-9), name
    assert post.height == 3


def test_tails_no_walk_can_follow_take_the_window_the_model_and_gamma(compact) -> None:
    """Without draft tokens no tail is walked: static's bounds are then the window and gamma
    on every trimmed request-step, its point the population model's in between."""
    _, run = compact
    p = build_pipeline(run.gamma, cost_table=AdditiveCostTable(**run.manifest["cost_table"]))
    steps = list(ReplaySource(str(run.path), speed=0).batches(threading.Event()))
    for batch in steps:
        batch.draft_tokens = None
        p.ingest(batch, "replay")
    p.close()
    sec = p.estimator.snapshot().sections()["trim_cost"]
    g = run.gamma
    want = {}
    for b in steps:
        trimmed = (b.accepted == b.window) & (b.window < g)
        for wl, w, a, t in zip(b.workload, b.window, b.accepted, trimmed, strict=True):
            lo, hi = want.get(wl, (0, 0))
            want[wl] = (lo + 1 + (w if t else a), hi + 1 + (g if t else a))
    for i, (wl, _, _) in enumerate(sec.labels.request.rows):
        lo = sec.static_committed_lower_tokens.values[i]
        point = sec.static_committed_tokens.values[i]
        hi = sec.static_committed_upper_tokens.values[i]
        assert (lo, hi) == want[wl]
        assert lo < point < hi
