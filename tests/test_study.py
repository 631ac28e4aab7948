"""The world study's all-step means, against a computation from the run's own tables."""

from __future__ import annotations

import json
import subprocess
import sys
from operator import itemgetter

import numpy as np
import pytest
from dspark_obs.estimator.study import all_step_means, summarize_study

from dspark_obs.recording import record_reference_run
from dspark_obs.recording.study import world_study
from dspark_obs.recording.workers import read_records
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.store import open_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("study") / "run"
    config = RuntimeConfig(seed=5, world="unstable-slots", shadow="cap-accept",
                           concurrency=[16], steps_per_level=60)  # fmt: skip
    record_reference_run(config, out, None)
    return open_run(out)


def test_all_step_means_by_hand(run):
    gamma = int(run.manifest["gamma"])
    req = run.requests().collect().to_pandas()
    blocks = run.scan("ceilings").collect().to_pandas()
    point = {(r.rank, r.forward_ct, r.rid): r.point for r in blocks.itertuples()}
    means = all_step_means(run)
    assert {m for _, m in means} == {"greedy", "sampled"}
    for (workload, method), entry in means.items():
        rows = req[(req.workload == workload) & ((req.greedy == 1) == (method == "greedy"))]
        est = [
            point[(r.rank, r.forward_ct, r.rid)]
            if r.correct_drafts == r.window and r.window < gamma
            else r.correct_drafts
            for r in rows.itertuples()
        ]
        assert entry["steps"] == len(rows)
        assert entry["truth"] == pytest.approx(rows.shadow_ceiling.mean(), rel=1e-12)
        assert entry["point"] == pytest.approx(np.mean(est), rel=1e-12)
        lo, hi = entry["interval"]
        assert lo <= entry["point"] <= hi


@pytest.fixture(scope="module")
def records():
    return world_study(["reference", "unstable-slots"], [0, 1], concurrency=8, steps=30, sts="none")


def test_a_study_has_one_record_per_world_seed_path_workload_and_method(records):
    keys = {(r["world"], r["seed"], r["path"], r["workload"], r["method"]) for r in records}
    assert len(keys) == len(records)
    assert {r["path"] for r in records} == {"in-band", "jsonl"}
    assert {r["method"] for r in records if r["path"] == "jsonl"} == {"sampled"}
    assert {r["world"] for r in records} == {"reference", "unstable-slots"}
    assert {r["workload"] for r in records if r["world"] == "unstable-slots"} == {
        "copy", "arena", "noise",
    }  # fmt: skip


def test_the_study_from_its_command_line(records, tmp_path):
    """Run in a worker process (`--device` reaches the run, which a synthetic world runs
    as before), appended to --out, summarised from the file."""
    out = tmp_path / "study.jsonl"
    study = [sys.executable, "-m", "dspark_obs.recording.study"]
    args = ["--worlds", "reference", "--seeds", "1", "--first-seed", "1", "--concurrency", "8",
            "--steps", "30", "--sts", "none", "--jobs", "2", "--device", "cpu",
            "--out", str(out)]  # fmt: skip
    subprocess.run([*study, *args], check=True, capture_output=True, timeout=300)
    expected = [r for r in records if r["world"] == "reference" and r["seed"] == 1]
    key = itemgetter("path", "workload", "method")
    assert sorted(read_records([str(out)]), key=key) == sorted(expected, key=key)
    summary = subprocess.run([*study, "--summarize", str(out), "--json"], check=True,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    assert json.loads(summary.stdout) == summarize_study(expected)
    bad = subprocess.run([*study, "--summarize", str(tmp_path / "none.jsonl")],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and "none.jsonl" in bad.stderr
