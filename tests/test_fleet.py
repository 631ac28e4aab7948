"""Post-hoc over many runs: `summary`, `calibration`, `estimate` (and the shipped SQL) over
two run directories equal the same figures computed from the union of their rows.

The commands fold each run into sums and add them (real subprocesses, real Parquet); the
reference (`tests/fleet_reference.py`) reads every row of both runs at once. Counts must
agree exactly, ratios to 1e-9, the binned AUROC within its bins' tied pairs of the exact one.
"""

from __future__ import annotations

import json
import shutil

import duckdb
import numpy as np
import polars as pl
import pytest

from dspark_obs.analysis.summary import ENTRY_KEYS
from dspark_obs.store import RunStoreError
from dspark_obs.store.checksums import checksum_path, file_record
from dspark_obs.store.fleet import expand_run_dirs, run_labels
from dspark_obs.store.layout import in_memory

from .conftest import cli
from .fleet_reference import (
    assert_same,
    blended_estimate,
    labelled,
    posthoc_calibration,
    stream_rate,
    summary_entry,
    union,
)
from .interval_reference import reference_interval

NODES = ["node-a", "west-7"]


def _json(*args: str) -> dict:
    return json.loads(cli(*args, "--json").stdout)


def _close(got: dict, want: dict, keys) -> None:
    for k in keys:
        if isinstance(want[k], float):
            assert got[k] == pytest.approx(want[k], abs=1e-9, rel=1e-12), k
        else:
            assert got[k] == want[k], k


def test_summary_of_two_runs_equals_their_union(fleet) -> None:
    root, runs = fleet
    got = _json("summary", str(root), "--by", "node,rank")
    assert got["runs"] == [{"path": str(r), "node": n} for r, n in zip(runs, NODES, strict=True)]
    reqs, steps = union(runs, "requests", NODES), union(runs, "steps", NODES)
    keys = [k for k in ENTRY_KEYS if k != "ceiling_source"]
    want = {**summary_entry(reqs, stream_rate(reqs, steps)), "steps": steps.height}
    _close(got["overall"], want, keys)
    assert sorted(got["workloads"]) == sorted(reqs["workload"].unique().to_list())
    for name, entry in got["workloads"].items():
        mine = reqs.filter(pl.col("workload") == name)
        _close(entry, summary_entry(mine, stream_rate(mine, steps)), keys)
    groups = {(g["node"], g["rank"]): g for g in got["groups"]}
    assert set(groups) == set(reqs.select("node", "rank").unique().iter_rows())
    for (node, rank), group in groups.items():
        part = reqs.filter((pl.col("node") == node) & (pl.col("rank") == rank))
        own = steps.filter((pl.col("node") == node) & (pl.col("rank") == rank))
        rate = stream_rate(part, own)
        _close(group["overall"], {**summary_entry(part, rate), "steps": own.height}, keys)
        for name, entry in group["workloads"].items():
            mine = part.filter(pl.col("workload") == name)
            _close(entry, summary_entry(mine, stream_rate(mine, own)), keys)
    # two RUN_DIRs name the same fleet as the directory that holds them
    assert _json("summary", *map(str, runs))["workloads"] == got["workloads"]


def test_the_shipped_sql_in_duckdb_equals_summary_json(fleet) -> None:
    root, runs = fleet
    script = cli("summary", "--sql", str(root)).stdout
    rows = duckdb.connect().execute(script)
    names = [d[0] for d in rows.description]
    got = {r[0]: dict(zip(names, r, strict=True)) for r in rows.fetchall()}
    want = _json("summary", *map(str, runs))["workloads"]
    assert sorted(got) == sorted(want)
    for name, entry in want.items():
        _close(got[name], entry, ENTRY_KEYS)


def test_calibration_of_two_runs_equals_their_union(fleet) -> None:
    root, runs = fleet
    got = _json("calibration", str(root), "--by", "node")
    reqs = union(runs, "requests", NODES)
    for keys, entries in (
        (["workload"], {(w,): e["positions"] for w, e in got["workloads"].items()}),
        (["workload", "node"], {(g["workload"], g["node"]): g["positions"] for g in got["groups"]}),
    ):
        want = labelled(reqs, keys)
        assert {(*k, p["position"]) for k, ps in entries.items() for p in ps if p["count"]} == set(
            want
        )
        for key, positions in entries.items():
            for p in positions:
                if not p["count"]:
                    continue
                ref = posthoc_calibration(*want[(*key, p["position"])])
                assert p["count"] == ref["count"]
                assert p["ece"] == pytest.approx(ref["ece"], abs=1e-9)
                assert p["brier"] == pytest.approx(ref["brier"], abs=1e-9)
                if ref["auroc_bound"] == ref["auroc_bound"]:  # both labels present
                    assert p["auroc"] == pytest.approx(ref["auroc"], abs=1e-9)
                    assert abs(p["auroc"] - ref["auroc_exact"]) <= ref["auroc_bound"] + 1e-12


def test_estimate_of_two_runs_equals_their_union(fleet) -> None:
    root, runs = fleet
    got = _json("estimate", str(root), "--by", "node")
    reqs, walks = union(runs, "requests", NODES), union(runs, "ceilings", NODES)
    gamma = int(reqs["gamma"].max())
    truth = reqs.select(
        "node", "rank", "forward_ct", "rid", pl.coalesce("ceiling", "shadow_ceiling").alias("t")
    )
    walks = walks.join(truth, on=["node", "rank", "forward_ct", "rid"], how="left")
    blended = blended_estimate(reqs, walks, gamma, ["workload"])
    for name, entry in got["workloads"].items():
        mine = reqs.filter(pl.col("workload") == name)
        assert entry["truth"] == pytest.approx(
            mine.select(pl.coalesce("ceiling", "shadow_ceiling")).to_series().mean(), abs=1e-9
        )
        for method in ("greedy", "sampled"):
            w = walks.filter((pl.col("workload") == name) & (pl.col("method") == method))
            m = entry[method]
            assert m["blocks"] == w.height
            if not w.height:
                continue
            for k in ("lo", "point", "hi"):
                assert m[k] == pytest.approx(w[k].mean(), abs=1e-9)
            assert m["truth"] == pytest.approx(w["t"].mean(), abs=1e-9)
            inside = ((w["lo"] <= w["t"]) & (w["t"] <= w["hi"])).mean()
            assert m["block_coverage"] == pytest.approx(inside, abs=1e-12)
            most = np.full(w.height, float(gamma))
            cols = (w[c].to_numpy() for c in ("lo", "hi", "var", "var_hi", "window"))
            assert m["interval"] == pytest.approx(reference_interval(*cols, most), rel=1e-9)
        ref = blended[(name,)]
        est = entry["estimate"]
        assert (est["observed_blocks"], est["walked_blocks"]) == (ref["blocks"], ref["walked"])
        for k in ("lo", "point", "hi"):
            want = (ref["tokens"] + ref[k]) / (ref["blocks"] + ref["walked"])
            assert est[k] == pytest.approx(want, abs=1e-9)
    nodes = {g["node"] for g in got["groups"]}
    assert nodes == set(NODES)
    for g in got["groups"]:
        part = walks.filter((pl.col("node") == g["node"]) & (pl.col("workload") == g["workload"]))
        assert g["counts"]["walked"] == part.height


def test_runs_that_cannot_be_merged_are_refused(fleet, mismatched_runs) -> None:
    root, runs = fleet
    g5, static = mismatched_runs
    for command in ("summary", "calibration", "estimate"):
        proc = cli(command, str(root), str(g5), check=False)
        assert proc.returncode == 2, proc.stderr
        assert "different gamma" in proc.stderr and "g5 gamma 5" in proc.stderr
    proc = cli("calibration", str(runs[0]), str(static), check=False)
    assert proc.returncode == 2 and "--by mode" in proc.stderr, proc.stderr
    by_mode = _json("summary", str(runs[0]), str(static), "--by", "mode")
    assert {g["mode"] for g in by_mode["groups"]} == {"compact", "static"}
    for bad in (["--by", "host"], [str(g5.parent)], [str(runs[0]), str(root)]):
        proc = cli("summary", *([str(runs[0])] if bad[0] == "--by" else []), *bad, check=False)
        assert proc.returncode == 2 and "error:" in proc.stderr and "Traceback" not in proc.stderr


def test_a_directory_of_runs_is_each_of_its_runs(fleet, tmp_path) -> None:
    """The one expansion every command, `report` included, goes through."""
    root, runs = fleet
    assert expand_run_dirs([root]) == runs
    assert run_labels(runs) == ["node-a", "other"]
    with pytest.raises(RunStoreError, match="given twice"):
        expand_run_dirs([root, runs[1]])
    (tmp_path / "empty").mkdir()
    proc = cli("report", str(tmp_path / "empty"), "--out", str(tmp_path / "o"), check=False)
    assert proc.returncode == 2 and "nor a directory of runs" in proc.stderr, proc.stderr


def test_a_fleet_of_both_matrix_layouts_reads_as_one(fleet, tmp_path) -> None:
    """One run's `requests` parts rewritten as writers before `store_version` 3 wrote them
    (each matrix one list column, zstd), with records of their new bytes: the commands and
    DuckDB's views over the fleet give what they give over the fleet as written (to the
    last bits of float sums, as between two runs of the same command)."""
    root, runs = fleet
    mixed = tmp_path / "fleet"
    shutil.copytree(root, mixed)
    parts = sorted((mixed / runs[0].name / "requests").glob("part-*.parquet"))
    for part in parts:
        in_memory(pl.read_parquet(part)).write_parquet(part, compression="zstd")
        checksum_path(part).write_bytes(file_record(part))
    assert "confidence" in pl.read_parquet_schema(parts[0])
    other = next((mixed / runs[1].name / "requests").glob("part-*.parquet"))
    assert "confidence_0" in pl.read_parquet_schema(other)

    for command in ("summary", "calibration", "estimate"):
        got, want = _json(command, str(mixed)), _json(command, str(root))
        assert [r["node"] for r in got["runs"]] == [r["node"] for r in want["runs"]]
        assert_same(got["workloads"], want["workloads"], command)
    script = cli("summary", "--sql", str(mixed)).stdout
    con = duckdb.connect()
    assert con.execute(script).fetchall() == (
        duckdb.connect().execute(cli("summary", "--sql", str(root)).stdout).fetchall()
    )
    # the views hold each layout's columns, null in the other's rows (the rows that record
    # a confidence counted in the fleet as written, where every part has the new layout)
    flat, lists = (
        pl.read_parquet(run / "requests" / "part-*.parquet")["confidence_0"].is_not_null().sum()
        for run in (runs[1], runs[0])
    )
    assert flat > 0 and lists > 0
    got = con.execute("SELECT count(confidence_0), count(confidence) FROM requests").fetchone()
    assert got == (flat, lists)
