"""Acceptance: fleet figures through a real Prometheus federation equal the union of the runs.

Two nodes, each a `serve` polling two SGLang-protocol fronts of two DP ranks (one compact, one
cap-accept: walks, and known ceilings) with its own traffic and seed. Each node has its own
Prometheus with the fleet rules and its own `cluster` external label; a global Prometheus
federates the nodes' `instance:...:sum` series and evaluates the fleet rules. Every fleet
figure it records per (workload, mode) must equal the same figure computed here, by a second
implementation reading only the two nodes' run directories: counts exactly, ratios to 1e-9,
and the binned AUROC within its bins' tied pairs of the exact AUROC. The post-hoc commands
over both run directories together, and the shipped SQL, must give the same figures.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from bench.sglang_load import polling_args
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime_server import RuntimeFrontend
from dspark_obs.store.layout import in_memory

from .conftest import cli
from .fleet_reference import posthoc_calibration
from .prometheus_harness import PrometheusServer, require_prometheus, scrape_job
from .serving import OPENER, generate
from .test_serve_cli import Child

require_prometheus()

FLEET_RULES = Path(__file__).resolve().parent.parent / "deploy" / "rules" / "fleet.yml"
EPS = 1e-8  # SGLang's clamp of predictions
FINE = 1020  # the live fine bins; 68 to an ECE bin, 34 to an exported AUROC bin
NODES = (("east", 11, 18), ("west", 23, 10))  # cluster, seed, requests per front


def _generate(url: str, rids: list[str], max_new_tokens: int) -> None:
    for rid in rids:
        generate(url, rid, max_new_tokens)


def _drive(fronts: list[RuntimeFrontend], seed: int, n: int) -> None:
    """Different traffic per node: its own mix of workloads and lengths, four clients a front."""
    rng = np.random.default_rng(seed)
    names = np.array(["gsm8k", "arena", "poetry"])
    threads = []
    for f, front in enumerate(fronts):
        rids = [f"{w}-{seed}-{f}-{i}" for i, w in enumerate(rng.choice(names, n))]
        for c in range(4):
            t = threading.Thread(target=_generate, args=(front.url, rids[c::4], 24 + 8 * c))
            t.start()
            threads.append(t)
    for t in threads:
        t.join()


def _records(fronts: list[RuntimeFrontend]) -> int:
    total = 0
    for front in fronts:
        with OPENER.open(f"{front.url}/server_info", timeout=30) as resp:
            info = json.loads(resp.read())
        total += sum(len(s["dspark_info_record"]["records"]) for s in info["internal_states"])
    return total


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """Runs both nodes and the three servers; returns the global figures and the run dirs."""
    base = tmp_path_factory.mktemp("federation")
    fronts, children, servers = [], [], []
    try:
        nodes = []
        for cluster, seed, n in NODES:
            pair = [
                RuntimeFrontend(RuntimeConfig(mode=mode, seed=seed + k), port=0, dp_size=2)
                for k, mode in enumerate(("compact", "cap-accept"))
            ]
            for front in pair:
                front.start()
            fronts += pair
            run = base / cluster / "run"
            child = Child(
                *polling_args(*(f.url for f in pair), poll_interval=0.2, out=run),
                "--no-clear",  # every record a rank keeps is read; none lost to a drain race
                workdir=base / cluster / "child",
            )
            children.append(child)
            hostport = child.url().split("//")[1].split("/")[0]
            nodes.append((cluster, seed, n, pair, child, run, hostport))
        for _, seed, n, pair, *_ in nodes:
            _drive(pair, seed, n)
        locals_ = []
        for cluster, _, _, pair, _, _, hostport in nodes:
            prom = PrometheusServer(
                {"dspark": [hostport]},
                scrape_interval="1s",
                external_labels={"cluster": cluster},
                rule_files=[FLEET_RULES],
            )
            prom.start()
            servers.append(prom)
            locals_.append((prom, pair))
        fed = PrometheusServer(
            scrape_job(
                "federate",
                [p.url.split("//")[1] for p, _ in locals_],
                metrics_path="/federate",
                honor_labels=True,
                params={"match[]": ['{__name__=~"instance:dspark_.*"}']},
            ),
            scrape_interval="1s",
            rule_files=[FLEET_RULES],
        )
        fed.start()
        servers.append(fed)
        # every record each node's ranks hold, ingested and federated from both clusters
        steps = {cluster: _records(pair) for (cluster, *_, pair, _, _, _) in nodes}
        for (prom, _), (cluster, *_) in zip(locals_, nodes, strict=True):
            prom.wait_for(
                "sum(dspark_steps_total)",
                lambda r, c=cluster: bool(r) and float(r[0]["value"][1]) == steps[c],
            )
        # a walk ends after the step that resolves it (or when its request is seen to finish):
        # with every step in and no walk open, the nodes' counters are final
        expected: dict[str, dict[str, float]] = {name: {} for name in SETTLED}
        for (prom, _), (cluster, *_) in zip(locals_, nodes, strict=True):
            prom.wait_for(
                "sum(dspark_estimator_pending_blocks)",
                lambda r: bool(r) and float(r[0]["value"][1]) == 0.0,
            )
            for name, raw_name in SETTLED.items():
                raw = prom.query_value(f"sum({raw_name})")
                prom.wait_for(
                    f"sum(instance:{name}:sum)",
                    lambda r, raw=raw: bool(r) and float(r[0]["value"][1]) == raw,
                )
                expected[name][cluster] = raw
        for name in SETTLED:
            fed.wait_for(
                f"sum by (cluster) (instance:{name}:sum)",
                lambda r, name=name: (
                    {x["metric"]["cluster"]: float(x["value"][1]) for x in r}
                    == {c: expected[name].get(c) for c, *_ in NODES}
                ),
            )
        # the rules' evaluations after this moment see everything federated
        federated_at = time.time() + 2.0  # two evaluation intervals of margin
        figures = {}
        for name in FIGURES:
            fed.wait_for(
                f"min(timestamp(workload:{name}:ratio))",
                lambda r: bool(r) and float(r[0]["value"][1]) > federated_at,
            )
            result = fed.wait_for(f"workload:{name}:ratio", bool)
            figures[name] = {_key(r["metric"]): float(r["value"][1]) for r in result}
        counts = {
            name: {
                _key(r["metric"]): float(r["value"][1])
                for r in fed.query(f"sum by (workload, mode) (instance:{name}:sum)")
            }
            for name in COUNTS
        }
        # walks still open are censored only when serve stops: none may be open here
        pending = [prom.query_value("sum(dspark_estimator_pending_blocks)") for prom, _ in locals_]
        for child in children:
            assert child.stop() == 0, child.describe()
        return figures, counts, pending, [run for *_, run, _ in nodes]
    finally:
        for prom in servers:
            prom.stop()
        for child in children:
            child.kill()
        for front in fronts:
            front.stop()


# the counters whose final values the global server must hold before figures are read
SETTLED = {
    "dspark_confidence_bin_rows": "dspark_confidence_bin_rows_total",
    "dspark_estimator_observed_blocks": "dspark_estimator_observed_blocks_total",
    "dspark_estimator_walked_blocks": (
        '{__name__=~"dspark_estimator_(resolved|censored)_blocks_total"}'
    ),
}
FIGURES = (
    "dspark_confidence_ece",
    "dspark_confidence_brier",
    "dspark_confidence_auroc",
    "dspark_utilisation",
    "dspark_ceiling_mean_tokens",
    "dspark_ceiling_estimate_tokens",
    "dspark_ceiling_estimate_lower_tokens",
    "dspark_ceiling_estimate_upper_tokens",
)
COUNTS = (
    "dspark_confidence_bin_rows",
    "dspark_ceiling_tokens_count",
    "dspark_estimator_observed_blocks",
    "dspark_estimator_walked_blocks",
)


def _key(metric: dict) -> tuple:
    position = metric.get("position")
    return (metric["workload"], metric["mode"], *(() if position is None else (int(position),)))


# --- the second implementation: the union of both nodes' run directories ---------------------


def _union(runs: list[Path], table: str) -> pl.DataFrame:
    return pl.concat([in_memory(pl.read_parquet(str(r / table / "part-*.parquet"))) for r in runs])


def _labelled(reqs: pl.DataFrame) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """Per (workload, mode, position): predictions and prefix labels of the labelled rows."""
    out: dict[tuple, tuple[list, list]] = {}
    for (wl, mode), g in reqs.filter(pl.col("survival").is_not_null()).group_by(
        ["workload", "mode"]
    ):
        surv = np.clip(g["survival"].to_numpy(), EPS, 1 - EPS)
        accepted = g["correct_drafts"].to_numpy()
        window = g["window"].to_numpy()
        ceiling = g["ceiling"].fill_null(-1).to_numpy()
        known = ceiling >= 0
        reach = np.where(known, ceiling, accepted)
        settled = known | (accepted < window)
        for j in range(surv.shape[1]):
            keep = settled | (j < accepted)
            if keep.any():
                out[(wl, mode, j)] = (surv[keep, j], (j < reach)[keep])
    return out


@np.errstate(invalid="ignore", divide="ignore")  # AUROC is NaN where one label is absent
def _calibration(p: np.ndarray, y: np.ndarray) -> dict[str, float]:
    fine = (p * FINE).astype(np.int64)
    ece_bin = fine // 68  # the fleet's AUROC is binned as ECE is
    ece = sum(abs(p[ece_bin == b].sum() - y[ece_bin == b].sum()) for b in range(15)) / len(p)
    pos = np.bincount(ece_bin[y], minlength=15)
    neg = np.bincount(ece_bin[~y], minlength=15)
    pairs = (pos * (np.cumsum(neg) - neg + 0.5 * neg)).sum() / (pos.sum() * neg.sum())
    # exact AUROC: Mann-Whitney with ties counted half, by sorting
    order = np.argsort(p, kind="stable")
    ranks = np.empty(len(p))
    sorted_p = p[order]
    _, first, count = np.unique(sorted_p, return_index=True, return_counts=True)
    ranks[order] = np.repeat(first + (count + 1) / 2.0, count)
    n_pos, n_neg = y.sum(), (~y).sum()
    exact = (ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return {
        "ece": ece,
        "brier": float(((p - y) ** 2).mean()),
        "auroc": pairs,
        "auroc_exact": exact,
        "auroc_bound": 0.5 * (pos * neg).sum() / (pos.sum() * neg.sum()),
        "rows": len(p),
    }


def test_fleet_figures_equal_the_union_of_the_nodes_runs(federation) -> None:
    figures, counts, pending, runs = federation
    reqs = _union(runs, "requests")
    assert sorted(reqs["rank"].unique().to_list()) == [0, 1, 1000, 1001]
    assert pending == [0.0, 0.0], pending

    # calibration, per (workload, mode, position)
    labelled = _labelled(reqs)
    assert set(figures["dspark_confidence_ece"]) == set(labelled)
    for key, (p, y) in labelled.items():
        want = _calibration(p, y)
        assert counts["dspark_confidence_bin_rows"].get(key[:2]) is not None
        assert figures["dspark_confidence_ece"][key] == pytest.approx(want["ece"], abs=1e-9)
        assert figures["dspark_confidence_brier"][key] == pytest.approx(want["brier"], abs=1e-9)
        if want["auroc_bound"] == want["auroc_bound"]:  # both labels present
            got = figures["dspark_confidence_auroc"][key]
            assert got == pytest.approx(want["auroc"], abs=1e-9)
            assert abs(got - want["auroc_exact"]) <= want["auroc_bound"] + 1e-12
    rows = {}
    for (wl, mode, _), (p, _) in labelled.items():
        rows[(wl, mode)] = rows.get((wl, mode), 0) + len(p)
    assert counts["dspark_confidence_bin_rows"] == {k: float(v) for k, v in rows.items()}

    # utilisation and mean ceiling, over rows whose ceiling is known
    known = (
        reqs.filter(pl.col("ceiling").is_not_null())
        .group_by(["workload", "mode"])
        .agg(pl.len().alias("n"), pl.col("ceiling").sum(), pl.col("correct_drafts").sum())
    )
    assert known.height > 0
    assert counts["dspark_ceiling_tokens_count"] == {
        (r["workload"], r["mode"]): float(r["n"]) for r in known.iter_rows(named=True)
    }
    for r in known.iter_rows(named=True):
        key = (r["workload"], r["mode"])
        util = r["correct_drafts"] / r["ceiling"]
        assert figures["dspark_utilisation"][key] == pytest.approx(util, abs=1e-9)
        mean = r["ceiling"] / r["n"]
        assert figures["dspark_ceiling_mean_tokens"][key] == pytest.approx(mean, abs=1e-9)

    # the ceiling estimate: observed ceilings and the ended walks' lo / point / hi
    gamma = reqs["gamma"].max()
    observed = (
        reqs.filter((pl.col("correct_drafts") < pl.col("window")) | (pl.col("window") == gamma))
        .group_by(["workload", "mode"])
        .agg(pl.len().alias("blocks"), pl.col("correct_drafts").sum().alias("tokens"))
    )
    walks = (
        _union(runs, "ceilings")
        .group_by(["workload", "mode"])
        .agg(
            pl.len().alias("walked"),
            pl.col("lo").sum(),
            pl.col("point").sum(),
            pl.col("hi").sum(),
        )
    )
    est = observed.join(walks, on=["workload", "mode"], how="full", coalesce=True).fill_null(0)
    assert walks.height > 0 and est["walked"].sum() > 0
    for r in est.iter_rows(named=True):
        key = (r["workload"], r["mode"])
        assert counts["dspark_estimator_observed_blocks"][key] == r["blocks"]
        # no walk was open when serving stopped: the run holds exactly the walks counted
        assert counts["dspark_estimator_walked_blocks"][key] == r["walked"]
        blocks = r["blocks"] + r["walked"]
        for name, col in (("", "point"), ("_lower", "lo"), ("_upper", "hi")):
            got = figures[f"dspark_ceiling_estimate{name}_tokens"][key]
            assert got == pytest.approx((r["tokens"] + r[col]) / blocks, abs=1e-9)


# --- the same figures post hoc: the commands over both nodes' run directories, and the SQL ----


def _cli_json(*args: str) -> dict:
    return json.loads(cli(*args, "--json").stdout)


def test_posthoc_fleet_figures_equal_the_federations(federation) -> None:
    """`summary`, `calibration` and `estimate` over both run directories (`--by mode`, as the
    fleet rules keep modes apart), and the shipped SQL in DuckDB, give the global server's
    figures."""
    figures, counts, _, runs = federation
    dirs = [str(r) for r in runs]
    reqs = _union(runs, "requests")

    calibration = _cli_json("calibration", *dirs, "--by", "mode")
    rows: dict[tuple, int] = {}
    labelled = _labelled(reqs)
    for group in calibration["groups"]:
        for p in group["positions"]:
            key = (group["workload"], group["mode"], p["position"])
            rows[key[:2]] = rows.get(key[:2], 0) + p["count"]
            if not p["count"]:
                continue
            assert p["ece"] == pytest.approx(figures["dspark_confidence_ece"][key], abs=1e-9)
            assert p["brier"] == pytest.approx(figures["dspark_confidence_brier"][key], abs=1e-9)
            live, posthoc = _calibration(*labelled[key]), posthoc_calibration(*labelled[key])
            if live["auroc_bound"] == live["auroc_bound"]:  # both labels present
                bound = live["auroc_bound"] + posthoc["auroc_bound"] + 1e-12
                assert abs(p["auroc"] - figures["dspark_confidence_auroc"][key]) <= bound
    assert {k: float(v) for k, v in rows.items() if v} == counts["dspark_confidence_bin_rows"]

    summary = _cli_json("summary", *dirs, "--by", "mode")
    known = {}
    for group in summary["groups"]:
        for name, entry in group["workloads"].items():
            key = (name, group["mode"])
            if not entry["ceiling_rows"]:
                continue
            known[key] = entry["ceiling_rows"]
            util, mean = entry["utilisation"], entry["mean_ceiling"]
            assert util == pytest.approx(figures["dspark_utilisation"][key], abs=1e-9)
            assert mean == pytest.approx(figures["dspark_ceiling_mean_tokens"][key], abs=1e-9)
    assert {k: float(v) for k, v in known.items()} == counts["dspark_ceiling_tokens_count"]

    estimate = _cli_json("estimate", *dirs, "--by", "mode")
    for group in estimate["groups"]:
        key, est = (group["workload"], group["mode"]), group["estimate"]
        assert est["observed_blocks"] == counts["dspark_estimator_observed_blocks"][key]
        assert est["walked_blocks"] == counts["dspark_estimator_walked_blocks"][key]
        for name, col in (("", "point"), ("_lower", "lo"), ("_upper", "hi")):
            got = figures[f"dspark_ceiling_estimate{name}_tokens"][key]
            assert est[col] == pytest.approx(got, abs=1e-9)

    # the SQL pools modes per workload: the federation's per-mode figures, pooled by their counts
    result = duckdb.connect().execute(cli("summary", "--sql", *dirs).stdout)
    names = [d[0] for d in result.description]
    sql = {r[0]: dict(zip(names, r, strict=True)) for r in result.fetchall()}
    for name, entry in sql.items():
        modes = [k for k in counts["dspark_ceiling_tokens_count"] if k[0] == name]
        n = sum(counts["dspark_ceiling_tokens_count"][k] for k in modes)
        ceiling = sum(
            figures["dspark_ceiling_mean_tokens"][k] * counts["dspark_ceiling_tokens_count"][k]
            for k in modes
        )
        accepted = sum(
            figures["dspark_utilisation"][k]
            * figures["dspark_ceiling_mean_tokens"][k]
            * counts["dspark_ceiling_tokens_count"][k]
            for k in modes
        )
        assert entry["ceiling_rows"] == n
        assert entry["mean_ceiling"] == pytest.approx(ceiling / n, abs=1e-9)
        assert entry["utilisation"] == pytest.approx(accepted / ceiling, abs=1e-9)
        del entry["workload"]
        assert entry == pytest.approx(summary["workloads"][name], abs=1e-9)
