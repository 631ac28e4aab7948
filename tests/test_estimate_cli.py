"""`dspark-obs estimate`, driven as a user drives it, checked against the run's own Parquet.

The numbers are recomputed here straight from the stored `requests` and
`ceilings` tables with polars, so a mistake in the report's joins, filters or
averages cannot hide behind the code that made it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from dspark_obs.store.layout import in_memory

from .conftest import cli
from .interval_reference import reference_interval

SGLANG_JSONL = Path(__file__).parent / "data" / "sglang" / "block_accept.sampled.jsonl"


def read_table(run: Path, table: str) -> pl.DataFrame:
    return in_memory(pl.read_parquet(run / table / "*.parquet"))


@pytest.fixture(scope="module")
def report(compact_run) -> dict:
    run, _ = compact_run
    return json.loads(cli("estimate", str(run), "--json").stdout)


@pytest.fixture(scope="module")
def tables(compact_run) -> tuple[int, pl.DataFrame, pl.DataFrame]:
    """(gamma, requests with their truth, ceilings joined with the truth of their opening step)."""
    run, _ = compact_run
    gamma = json.loads((run / "run.json").read_text())["gamma"]
    req = read_table(run, "requests").with_columns(
        (pl.col("verify_len") - 1).alias("w"), pl.col("shadow_ceiling").alias("truth")
    )
    ceil = read_table(run, "ceilings").join(
        req.select("rank", "forward_ct", "rid", "truth"),
        on=["rank", "forward_ct", "rid"],
        how="left",
        validate="1:1",
    )
    return gamma, req, ceil


def test_report_shape(report, compact_run):
    run, summary = compact_run
    manifest = json.loads((run / "run.json").read_text())
    assert report["gamma"] == manifest["gamma"]
    assert set(report["workloads"]) == set(manifest["workloads"]) == set(summary["workloads"])
    for name, e in report["workloads"].items():
        assert isinstance(e["truth"], float), name
        assert {"mean", "exact_rate", "censored_rate", "lo", "point", "hi", "blocks"} <= set(
            e["greedy"]
        ), name
        assert {"lo", "point", "hi", "interval", "blocks", "censored_rate"} <= set(e["sampled"])
        pop = e["population"]
        assert {"mean", "survival", "identifiable", "truth_survival"} <= set(pop)
        assert len(pop["survival"]) == len(pop["identifiable"]) == report["gamma"]
        assert len(pop["truth_survival"]) == report["gamma"]
        counts = {"blocks", "trimmed", "walked", "resolved", "censored", "skipped"}
        assert set(e["counts"]) == counts


def test_counts_and_truth_match_the_parquet(report, tables):
    gamma, req, ceil = tables
    assert req["truth"].null_count() == 0  # the shadow reveals every request-step
    for name, e in report["workloads"].items():
        part = req.filter(pl.col("workload") == name)
        trimmed = part.filter((pl.col("correct_drafts") == pl.col("w")) & (pl.col("w") < gamma))
        walked = ceil.filter(pl.col("workload") == name)
        censored = int((walked["status"] == "censored").sum())
        assert e["counts"] == {
            "blocks": part.height,
            "trimmed": trimmed.height,
            "walked": walked.height,
            "resolved": walked.height - censored,
            "censored": censored,
            "skipped": trimmed.height - walked.height,
        }
        # the runtime says how every request samples and carries log-probs: all trimmed walk
        keys = ["rank", "forward_ct", "rid"]
        assert walked.select(keys).sort(keys).equals(trimmed.select(keys).sort(keys))
        assert e["truth"] == pytest.approx(part["truth"].mean(), rel=1e-12)
        ceiling = part["truth"].to_numpy()
        want = [float((ceiling > j).mean()) for j in range(gamma)]
        assert e["population"]["truth_survival"] == pytest.approx(want, abs=1e-12)
        # a ceiling on 0..gamma has mean sum_j P(ceiling > j)
        assert e["population"]["mean"] == pytest.approx(sum(e["population"]["survival"]))


@pytest.mark.parametrize("method", ["greedy", "sampled"])
def test_method_means_match_the_parquet(report, tables, method):
    gamma, _, ceil = tables
    for name, e in report["workloads"].items():
        part = ceil.filter((pl.col("workload") == name) & (pl.col("method") == method))
        m = e[method]
        assert m["blocks"] == part.height
        if part.height == 0:
            continue
        for col in ("lo", "point", "hi"):
            assert m[col] == pytest.approx(part[col].mean(), rel=1e-12), (name, col)
        assert m["censored_rate"] == pytest.approx((part["status"] == "censored").mean())
        assert (part["var_hi"] >= part["var"] - 1e-12).all()  # every unreached draft accepted
        most = np.full(part.height, float(gamma))
        cols = (part[c].to_numpy() for c in ("lo", "hi", "var", "var_hi", "window"))
        lo, hi = reference_interval(*cols, most)
        assert m["interval"] == pytest.approx([lo, hi], rel=1e-9)
        truth = part["truth"].mean()
        assert m["truth"] == pytest.approx(truth, rel=1e-12)
        assert m["covered"] == (lo <= truth <= hi)
        if method == "greedy":
            exact = part.filter(pl.col("status") == "exact")
            assert m["mean"] == pytest.approx(part["point"].mean(), rel=1e-12)
            assert m["exact_rate"] == pytest.approx(exact.height / part.height)
            assert m["exact_agreement"] == 1.0  # greedy walks are exact on this runtime
            assert (exact["lo"] == exact["hi"]).all()
        else:
            assert (part["status"] != "exact").all()
            assert (part["lo"] <= part["point"]).all() and (part["point"] <= part["hi"]).all()


def test_estimate_repeats_bit_for_bit(report, compact_run):
    """polars joins and sums in parallel; the walks keep their order, so a second
    estimate of the same run prints the same bytes."""
    run, _ = compact_run
    again = cli("estimate", str(run), "--json").stdout
    assert json.loads(again) == report
    assert again == cli("estimate", str(run), "--json").stdout


def test_text_output_names_every_workload(compact_run):
    run, summary = compact_run
    out = cli("estimate", str(run)).stdout
    for name in summary["workloads"]:
        assert name in out, name
    assert "greedy walk" in out and "sampled walk" in out and "population" in out


def test_run_without_ceilings_is_estimated_by_replay(compact_run, tmp_path):
    """Older runs have no `ceilings` table; replay walks them without gathered log-probs."""
    run = tmp_path / "run"
    shutil.copytree(compact_run[0], run)  # the session's run, copied: its ceilings go
    in_band = json.loads(cli("estimate", str(run), "--json").stdout)
    # as a run written before the table existed: no parts, no records, fewer parts counted
    shutil.rmtree(run / "ceilings")
    shutil.rmtree(run / "_checksums" / "ceilings")
    manifest = json.loads((run / "run.json").read_text())
    manifest["parts"] = len({p.name for p in run.glob("*/part-*.parquet")})
    (run / "run.json").write_text(json.dumps(manifest))
    replay = json.loads(cli("estimate", str(run), "--json").stdout)
    assert not (run / "ceilings").exists()  # estimating never writes into the run
    assert set(replay["workloads"]) == set(in_band["workloads"])
    for name, r in replay["workloads"].items():
        b = in_band["workloads"][name]
        assert r["counts"] == b["counts"], name
        assert r["truth"] == b["truth"]
        # greedy walks never read the verify distributions: the same outcomes
        for key in ("blocks", "lo", "point", "hi", "exact_rate", "censored_rate"):
            assert r["greedy"].get(key) == pytest.approx(b["greedy"].get(key), rel=1e-12), key
        # without the mismatch's log-prob the sampled interval can only widen
        if r["sampled"]["blocks"]:
            assert r["sampled"]["blocks"] == b["sampled"]["blocks"]
            assert r["sampled"]["lo"] <= b["sampled"]["lo"] + 1e-12
            assert r["sampled"]["hi"] >= b["sampled"]["hi"] - 1e-12


def test_estimate_without_a_source_says_what_it_needs():
    proc = cli("estimate", check=False)
    assert proc.returncode == 2
    assert "RUN_DIR" in proc.stderr and "--sglang-jsonl" in proc.stderr
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr


def test_sglang_jsonl_gamma_is_implied_as_ingest_implies_it():
    implied = json.loads(cli("estimate", "--sglang-jsonl", str(SGLANG_JSONL), "--json").stdout)
    given = json.loads(
        cli("estimate", "--sglang-jsonl", str(SGLANG_JSONL), "--gamma", "7", "--json").stdout
    )
    assert implied == given and implied["gamma"] == 7 and implied["bad_lines"] == 0


def test_sglang_jsonl_sampled_walk():
    args = ("estimate", "--sglang-jsonl", str(SGLANG_JSONL), "--gamma", "7")
    report = json.loads(cli(*args, "--json").stdout)
    assert report["gamma"] == 7
    assert set(report["workloads"]) == {"gsm8k", "arena", "poetry"}
    for name, e in report["workloads"].items():
        s = e["sampled"]
        assert s["blocks"] > 0, name
        assert s["mean_lo"] <= s["mean_point"] <= s["mean_hi"], name
        assert s["ci_lo"] <= s["mean_lo"] and s["mean_hi"] <= s["ci_hi"], name
        assert 0 <= s["mean_lo"] and s["mean_hi"] <= 7
        assert np.isfinite([s["mean_lo"], s["mean_point"], s["mean_hi"]]).all()


def test_a_walks_only_run_is_estimated_and_summary_points_there(tmp_path):
    """An ingested block-accept JSONL holds ceilings but no request-steps."""
    data = Path(__file__).parent / "data" / "sglang" / "block_accept.sampled.jsonl"
    out = tmp_path / "ba"
    cli("ingest", str(data), "--out", str(out), "--workload-from-rid", r"^(?P<workload>[a-z0-9]+)-")
    report = json.loads(cli("estimate", str(out), "--json").stdout)
    assert set(report["workloads"]) == {"gsm8k", "arena", "poetry"}
    ceilings = pl.read_parquet(out / "ceilings" / "*.parquet")
    for name, entry in report["workloads"].items():
        part = ceilings.filter(pl.col("workload") == name)
        assert entry["sampled"]["blocks"] == part.height
        assert entry["sampled"]["point"] == pytest.approx(part["point"].mean())
    proc = cli("summary", str(out), check=False)
    assert proc.returncode == 2 and "estimate" in proc.stderr and "Traceback" not in proc.stderr
