"""`dspark-obs report` over many runs: one fleet, whose figures are those `summary`,
`calibration` and `estimate` give over the same runs, and the union of their rows.

Real subprocesses over real Parquet: the report of a directory of two runs (`--by
node,rank`) against the three commands given the two run directories one by one (their
own agreement with the union of the rows is `test_fleet.py`'s), and its tables parsed
back from summary.md against the union computed here. Runs that cannot be merged are
refused with exit 2 and a message saying how to compare them instead.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest

from .conftest import cli
from .fleet_reference import union
from .test_report import assert_png_ok, num, parse_tables

NODES = ["node-a", "west-7"]


@pytest.fixture(scope="module")
def fleet_report(fleet, tmp_path_factory):
    root, runs = fleet
    out = tmp_path_factory.mktemp("fleet-report")
    proc = cli("report", str(root), "--by", "node,rank", "--out", str(out), "--top", "5", "--quiet")
    report = json.loads((out / "report.json").read_text())
    return runs, out, proc, report, parse_tables((out / "summary.md").read_text())


def _commands(runs, command: str) -> dict:
    return json.loads(cli(command, *map(str, runs), "--by", "node,rank", "--json").stdout)


def _same(got, want, path: str = "$") -> None:
    """Equal JSON values, floats to 1e-12 (the same sums, added in the same order)."""
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for k in want:
            _same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{path}[{i}]")
    elif isinstance(want, float) and not np.isfinite(want):
        assert not np.isfinite(got) and (np.isnan(got) == np.isnan(want)), path
    elif isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12), path
    else:
        assert got == want, path


def test_one_fleet_arm_over_the_directory_of_runs(fleet_report):
    runs, out, proc, report, _ = fleet_report
    assert list(report) == ["fleet"]
    fleet = report["fleet"]
    assert fleet["run"] is None and fleet["by"] == ["node", "rank"]
    assert fleet["runs"] == [{"path": str(r), "node": n} for r, n in zip(runs, NODES, strict=True)]
    pngs = sorted(out.glob("*.png"))
    assert any(p.name.endswith("-fleet.png") for p in pngs), [p.name for p in pngs]
    assert not any("node-a" in p.name or "other" in p.name for p in pngs)  # no arm per run
    for png in pngs:
        assert_png_ok(png)
    text = (out / "summary.md").read_text()
    assert "fleet: 2 runs (node-a, west-7)" in text
    assert "had no STS" not in text  # node-a's run had one, though west-7's had none
    assert "predicted per run" in fleet["whatif_missing"] and "report.html" in proc.stdout


def test_summary_part_equals_summary_command(fleet_report):
    runs, _, _, report, tables = fleet_report
    want = _commands(runs, "summary")
    got = report["fleet"]["summary"]
    for key in ("overall", "workloads", "groups", "load", "by", "runs"):
        _same(got[key], want[key], key)
    rows = {r["workload"]: r for r in tables["fleet: per workload"]}
    assert sorted(rows) == sorted(want["workloads"])
    for name, entry in want["workloads"].items():
        assert num(rows[name]["request-steps"]) == entry["request_steps"]
        assert num(rows[name]["utilisation"]) == pytest.approx(entry["utilisation"], abs=5e-4)
    groups = tables["fleet: per node, rank and workload"]
    want_rows = [(g, w) for g in want["groups"] for w in g["workloads"]]
    assert len(groups) == len(want_rows)
    for row, (g, name) in zip(groups, want_rows, strict=True):
        assert row["group"] == f"node={g['node']} rank={g['rank']}" and row["workload"] == name
        entry = g["workloads"][name]
        assert num(row["request-steps"]) == entry["request_steps"]
        assert num(row["accepted"]) == pytest.approx(entry["mean_accepted"], abs=5e-4)


def test_calibration_part_equals_calibration_command(fleet_report):
    runs, _, _, report, tables = fleet_report
    want = _commands(runs, "calibration")
    got = report["fleet"]["calibration"]["survival"]
    _same(got["overall"], want["overall"]["positions"])
    for name, entry in want["workloads"].items():
        _same(got["workloads"][str(name)], entry["positions"], name)
    _same(got["groups"], want["groups"])
    rows = tables["fleet: calibration per position"]
    for row, p in zip(rows, want["overall"]["positions"], strict=True):
        assert num(row["rows"]) == p["count"]
        assert num(row["ECE after"]) == pytest.approx(p["ece"], abs=5e-5)


def test_estimate_part_equals_estimate_command(fleet_report):
    runs, _, _, report, tables = fleet_report
    want = _commands(runs, "estimate")
    got = report["fleet"]["estimate"]
    _same(got["workloads"], want["workloads"])
    _same(got["groups"], want["groups"])
    for row in tables["fleet: estimated vs true ceiling"]:
        if row["method"] == "population":
            continue
        m = want["workloads"][row["workload"]][row["method"].split()[0]]
        assert num(row["blocks"]) == m["blocks"]
        assert num(row["point"]) == pytest.approx(m["point"], abs=5e-4)


def test_shares_load_and_drill_down_equal_the_union(fleet_report):
    runs, _, _, _, tables = fleet_report
    reqs, steps = union(runs, "requests", NODES), union(runs, "steps", NODES)
    counts = reqs.group_by("workload", "window").len()
    totals = reqs.group_by("workload").len().rename({"len": "total"})
    share = {
        (w, k): n / t
        for w, k, n, t in counts.join(totals, on="workload")
        .select("workload", "window", "len", "total")
        .iter_rows()
    }
    for row in tables["fleet: share of request-steps at each verify window"]:
        for k in range(8):
            want = share.get((row["workload"], k), 0.0)
            assert num(row[str(k)]) == pytest.approx(want, abs=5e-5)
    busy = steps.filter(pl.col("bs") > 0)
    levels = {
        bs: (n, budget / bs_sum)
        for bs, n, budget, bs_sum in busy.group_by("bs")
        .agg(pl.len(), pl.col("budget").sum(), pl.col("bs").sum().alias("b"))
        .iter_rows()
    }
    load = {int(num(r["bs"])): r for r in tables["fleet: load levels"]}
    assert sorted(load) == sorted(levels)
    for bs, (n, budget) in levels.items():
        assert num(load[bs]["steps"]) == n
        assert num(load[bs]["budget/request"]) == pytest.approx(budget, abs=5e-4)
    loss = (
        reqs.with_columns(
            pl.format("{}/{}", "node", "rid").alias("rid"),
            (pl.coalesce("ceiling", "shadow_ceiling") - pl.col("correct_drafts"))
            .clip(lower_bound=0)
            .alias("loss"),
        )
        .group_by("rid")
        .agg(pl.col("loss").sum(), pl.len().alias("steps"))
        .sort(["loss", "rid"], descending=[True, False])
        .head(5)
    )
    rows = tables["fleet: top 5 requests by trim loss"]
    assert [r["rid"] for r in rows] == loss["rid"].to_list()
    for row, (_, want, n) in zip(rows, loss.iter_rows(), strict=True):
        assert num(row["trim loss"]) == pytest.approx(want) and num(row["steps"]) == n


def test_runs_that_cannot_be_merged_are_refused(fleet, mismatched_runs, tmp_path):
    root, runs = fleet
    g5, static = mismatched_runs
    out = str(tmp_path / "o")
    for other, needle in ((g5, "g5 gamma 5"), (static, "--by mode")):
        proc = cli("report", str(root), str(other), "--out", out, "--quiet", check=False)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert needle in proc.stderr and "--arms" in proc.stderr, proc.stderr
    for bad, needle in ((["--by", "host"], "--by 'host'"), (["--arms", "--by", "node"], "--arms")):
        proc = cli("report", *map(str, runs), *bad, "--out", out, check=False)
        assert proc.returncode == 2 and needle in proc.stderr, proc.stderr
    assert not (tmp_path / "o" / "report.json").exists()


def test_fleet_summary_and_report_give_the_same_total_throughput(tmp_path):
    """Two nodes each serving at one batch size: the summary's overall tokens/s and the
    report's load curve at that batch size are the same figure (every node's tokens over
    its own step time, added), and so equal the nodes' own summaries added up."""
    root = tmp_path / "nodes"
    for node, seed in (("a", "1"), ("b", "2")):
        cli(
            "run",
            *("--concurrency", "8", "--steps-per-level", "30", "--sts", "none"),
            *("--seed", seed, "--out", str(root / node), "--quiet"),
        )
    fleet = json.loads(cli("summary", str(root), "--json").stdout)
    own = [
        json.loads(cli("summary", str(root / n), "--json").stdout)["overall"] for n in ("a", "b")
    ]
    total = fleet["overall"]["throughput_tokens_per_s"]
    assert total == pytest.approx(sum(o["throughput_tokens_per_s"] for o in own), rel=1e-12)
    cli("report", str(root), "--out", str(tmp_path / "report"), "--quiet")
    (level,) = json.loads((tmp_path / "report" / "report.json").read_text())["fleet"]["load"]
    assert level["bs"] == 8 and level["ranks"] == 2
    assert level["throughput_tokens_per_s"] == pytest.approx(total, rel=1e-12)
