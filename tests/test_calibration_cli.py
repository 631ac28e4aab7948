"""`dspark-obs calibration`: what a user runs on a stored run, against the run's own Parquet.

The report is recomputed from the `requests` table with polars, numpy,
torchmetrics (ECE) and scikit-learn (AUROC), labelling rows from the
`ceiling` / `shadow_ceiling` columns directly, so neither the run store's
readers nor the calibration module stand behind the expected numbers.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from sklearn.metrics import roc_auc_score
from torchmetrics.classification import BinaryCalibrationError

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.store import RunWriter
from dspark_obs.store.layout import in_memory

from .conftest import SMALL_RUN, cli

EPS = 1e-8
KEYS = {"position", "ece", "brier", "auroc", "pred_mean", "target_mean", "count"}


@pytest.fixture(scope="module")
def half_shadow_run(tmp_path_factory) -> Path:
    """Half the requests lack a shadow twin, so censored compact rows are in the report."""
    out = tmp_path_factory.mktemp("runs") / "half-shadow"
    cli(
        "run",
        "--mode",
        "compact",
        "--shadow",
        "cap-accept",
        "--shadow-fraction",
        "0.5",
        "--out",
        str(out),
        *SMALL_RUN,
    )
    return out


def labelled_rows(run_dir: Path) -> dict[str, dict[str, np.ndarray]]:
    """Per workload: clamped survival `[n, gamma]`, prefix labels and which are known."""
    df = in_memory(pl.read_parquet(str(run_dir / "requests" / "*.parquet"))).filter(
        pl.col("survival").is_not_null()
    )
    gamma = int(df["gamma"][0])
    out = {}
    for name in sorted(set(df["workload"].to_list())):
        part = df.filter(pl.col("workload") == name)
        surv = np.array(part["survival"].to_list(), dtype=np.float64)
        accepted = part["correct_drafts"].to_numpy()[:, None]
        window = part["window"].to_numpy()[:, None]
        known = (
            part.select(pl.coalesce("ceiling", "shadow_ceiling").fill_null(-1))
            .to_series()
            .to_numpy()[:, None]
        )
        j = np.arange(gamma)[None, :]
        # label at j: the first j+1 drafts were accepted
        labels = np.where(known >= 0, j < known, j < accepted)
        # censored rows answer for accepted positions, and for the rest only after a
        # rejection inside the window
        labelled = (known >= 0) | (j < accepted) | (accepted < window)
        out[name] = {"p": np.clip(surv, EPS, 1 - EPS), "y": labels, "known": labelled}
    return out


def merge(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([p[k] for p in parts]) for k in ("p", "y", "known")}


def check_positions(positions: list[dict], rows: dict, bins: int = 15) -> dict[str, float]:
    """One report section against the rows; returns the largest deviations seen."""
    worst = {"ece": 0.0, "auroc": 0.0, "auroc_bound": 0.0}
    gamma = rows["p"].shape[1]
    assert [p["position"] for p in positions] == list(range(gamma))
    for entry in positions:
        assert set(entry) == KEYS
        j = entry["position"]
        sel = rows["known"][:, j]
        p, y = rows["p"][sel, j], rows["y"][sel, j]
        assert entry["count"] == len(p)
        if not len(p):
            assert entry["ece"] is None and entry["brier"] is None
            continue
        # away from the edges k/bins, floor(p * bins) and torch.bucketize agree
        assert np.abs(p * bins - np.round(p * bins)).min() > 1e-9
        ece = BinaryCalibrationError(n_bins=bins, norm="l1")(
            torch.from_numpy(p), torch.from_numpy(y.astype(np.int64))
        ).item()
        worst["ece"] = max(worst["ece"], abs(entry["ece"] - ece))
        assert entry["ece"] == pytest.approx(ece, abs=1e-9)
        assert entry["brier"] == pytest.approx(np.mean((p - y) ** 2), rel=1e-10)
        assert entry["pred_mean"] == pytest.approx(p.mean(), rel=1e-12)
        assert entry["target_mean"] == pytest.approx(y.mean(), rel=1e-12)
        if y.all() or not y.any():
            assert entry["auroc"] is None  # NaN becomes null in JSON
            continue
        # SGLang's AUROC uses 1,024 bins; within a bin a positive and a negative count
        # half, so the deviation from the exact value is at most 0.5 sum P_b N_b / (P N).
        fine = np.minimum((p * 1024).astype(np.int64), 1023)
        pos, neg = np.bincount(fine[y], minlength=1024), np.bincount(fine[~y], minlength=1024)
        bound = 0.5 * (pos * neg).sum() / (pos.sum() * neg.sum())
        dev = abs(entry["auroc"] - roc_auc_score(y, p))
        worst["auroc"] = max(worst["auroc"], dev)
        worst["auroc_bound"] = max(worst["auroc_bound"], bound)
        assert dev <= bound + 1e-12
    return worst


@pytest.mark.parametrize("which", ["compact_run", "half_shadow_run"])
def test_json_matches_torchmetrics_sklearn_numpy(which, request):
    fixture = request.getfixturevalue(which)
    run_dir = fixture[0] if isinstance(fixture, tuple) else fixture
    report = json.loads(cli("calibration", str(run_dir), "--json").stdout)
    assert {"workloads", "overall"} <= set(report)
    rows = labelled_rows(run_dir)
    assert set(report["workloads"]) == set(rows) and len(rows) == 3
    for name, section in report["workloads"].items():
        assert set(section) == {"positions"}
        check_positions(section["positions"], rows[name])
    check_positions(report["overall"]["positions"], merge(list(rows.values())))
    last = [p["count"] for p in report["overall"]["positions"]]
    n = len(merge(list(rows.values()))["p"])
    if which == "compact_run":
        assert last == [n] * len(last)  # every request has a twin: every position known
    else:
        assert last[-1] < last[0] <= n  # fully accepted short windows are left out


def test_bins_option_is_honoured(compact_run):
    run_dir, _ = compact_run
    report = json.loads(cli("calibration", str(run_dir), "--json", "--bins", "10").stdout)
    assert report["bins"] == 10
    check_positions(
        report["overall"]["positions"], merge(list(labelled_rows(run_dir).values())), 10
    )


def test_text_table_names_every_workload(compact_run):
    run_dir, _ = compact_run
    out = cli("calibration", str(run_dir)).stdout
    for name in [*labelled_rows(run_dir), "overall"]:
        assert f"{name}: calibration of survival" in out, name
    assert "ECE" in out and "AUROC" in out


@pytest.mark.parametrize(
    "kind, message",
    [
        ("missing", "no such run directory"),
        ("not_a_run", "missing run manifest"),
        ("no_confidence", "no confidence recorded"),
    ],
)
def test_bad_run_dir_exits_2_with_a_message(kind, message, tmp_path):
    run_dir = tmp_path / "nope"
    if kind == "not_a_run":
        run_dir.mkdir()
        (run_dir / "notes.txt").write_text("hello")
    if kind == "no_confidence":
        # a real run whose source had no confidence head (SGLang without one)
        config = RuntimeConfig(mode="compact", concurrency=[4], steps_per_level=5, seed=2)
        writer = RunWriter(run_dir, {"gamma": config.gamma, "mode": "compact"})
        for b in DSparkRuntime(config).run():
            writer.append(dataclasses.replace(b, survival=None, confidence=None))
        writer.close()
    proc = cli("calibration", str(run_dir), "--json", check=False)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("dspark-obs calibration: error:")
    assert message in proc.stderr and str(run_dir) in proc.stderr
    assert "Traceback" not in proc.stderr
