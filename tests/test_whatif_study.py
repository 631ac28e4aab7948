"""The what-if study's machinery: pairs run in worker processes, the truth measured from the
real runs' tables, and the summary's arithmetic against a plain recomputation.

Two seeds of a tiny sweep (two levels: 60 steps at batch 2, 30 at 8; static only) run once
per module in two worker processes; the CLI's `--summarize` is driven as a subprocess on
their records.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from statistics import mean

import pytest

from dspark_obs.analysis.load import load_curve
from dspark_obs.recording.workers import read_records
from dspark_obs.whatif.study import PAIR_FILE, kept_pairs, level_steps, repredict, whatif_study
from dspark_obs.whatif.study_summary import (
    TARGET_ERROR,
    Z95_2,
    format_summary,
    format_totals,
    study_noise,
    study_totals,
    summarize_whatif_study,
)
from dspark_obs.whatif.study_truth import measured_cells


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    parts = []
    keep = tmp_path_factory.mktemp("kept")
    records = whatif_study(["reference"], [0, 1], policies=("static",), concurrency=(2, 8),
                           steps=30, request_steps=120, jobs=2, sink=parts.append,
                           keep=str(keep))  # fmt: skip
    return records, parts, keep


def test_kept_runs_predict_again_to_the_same_records(study, tmp_path):
    records, _, keep = study
    assert sorted(p.name for p in kept_pairs(keep)) == ["reference-seed0", "reference-seed1"]
    pair = json.loads((keep / "reference-seed1" / PAIR_FILE).read_text())
    assert pair["level_steps"] == [60, 30] and pair["policies"] == ["static"]
    _same_records(repredict(keep), records)
    cmd = [sys.executable, "-m", "dspark_obs.whatif.study"]
    out = tmp_path / "again.jsonl"
    proc = subprocess.run([*cmd, "--repredict", str(keep), "--out", str(out), "--json"],
                          capture_output=True, text=True, check=True, timeout=300)  # fmt: skip
    assert len(json.loads(proc.stdout)["cells"]) == len(summarize_whatif_study(records))
    _same_records(sorted(read_records([str(out)]), key=_order), records)
    for args, says in ((["--repredict", str(tmp_path)], "no kept pairs"),
                       (["--keep", str(keep), "--seeds", "1", "--steps", "5",
                         "--concurrency", "2"], "exists")):  # fmt: skip
        bad = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr


def _order(r: dict) -> tuple:
    return (r["world"], r["seed"], r["policy"], r["level"], r["workload"])


def _same_records(got: list[dict], want: list[dict]) -> None:
    """The same records in the same order, figures to the last digits (polars may sum a
    cell's rows in another order in another process)."""
    assert [_order(r) for r in got] == [_order(r) for r in want]
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for k, v in w.items():
            assert g[k] == (pytest.approx(v, rel=1e-12) if isinstance(v, float) else v), k


def test_pairs_run_in_workers_and_reach_the_sink(study):
    records, parts, _ = study
    assert len(parts) == 2  # one call per (world, seed), as each finished
    assert sorted(r["seed"] for part in parts for r in part) == sorted(r["seed"] for r in records)
    cells = {(r["seed"], r["policy"], r["level"], r["workload"]) for r in records}
    assert len(cells) == len(records)
    for seed in (0, 1):
        for policy in ("own", "static"):
            assert {
                (lv, w) for s, p, lv, w in cells if (s, p) == (seed, policy) and w == "all"
            } == {
                (2, "all"),
                (8, "all"),
            }


def test_own_prediction_reproduces_the_measured_run(study):
    for r in study[0]:
        if r["policy"] == "own":
            assert r["tokens_per_s_predicted"] == pytest.approx(r["tokens_per_s_real"], rel=1e-9)
            assert r["mean_accepted_predicted"] == pytest.approx(r["mean_accepted_real"])
            assert r["request_steps"] == r["request_steps_real"]


def test_measured_cells_are_the_load_curve(compact_run):
    from dspark_obs.store import open_run

    run = open_run(compact_run[0])
    cells = measured_cells(run)
    for row in load_curve(run).iter_rows(named=True):
        c = cells[(row["bs"], "all")]
        assert c["tokens_per_s"] == pytest.approx(row["throughput_tokens_per_s"], rel=1e-12)
        assert c["step_ms"] == pytest.approx(row["mean_step_ms"], rel=1e-12)


def _by_hand(records: list[dict]) -> dict:
    """The summary recomputed with plain Python, cell by cell."""
    out = {}
    keys = {(r["world"], r["policy"], r["level"]) for r in records}
    for key in keys:
        rows = [r for r in records if (r["world"], r["policy"], r["level"]) == key]
        for scope, pick in (("all", lambda r: r["workload"] == "all"),
                            ("wl", lambda r: r["workload"] != "all")):  # fmt: skip
            part = [r for r in rows if pick(r)]
            if not part:
                continue
            err = {id(r): r["tokens_per_s_predicted"] / r["tokens_per_s_real"] - 1 for r in part}
            by_cell: dict[str, list[float]] = {}
            for r in part:
                by_cell.setdefault(r["workload"], []).append(err[id(r)])
            worst = max(by_cell, key=lambda w: abs(mean(by_cell[w])))
            out[(*key, scope)] = {
                "seed_max": max(abs(e) for e in err.values()),
                "mean": mean(by_cell[worst]),
                "within": sum(abs(e) <= TARGET_ERROR for e in err.values()) / len(part),
                "coverage": mean(
                    r["tokens_per_s_lo"] <= r["tokens_per_s_real"] <= r["tokens_per_s_hi"]
                    for r in part
                ),
            }
    return out


def test_summary_arithmetic(study):
    records = study[0]
    rows = summarize_whatif_study(records)
    hand = _by_hand(records)
    assert len(rows) == len({k[:3] for k in hand})
    assert any(abs(r["all_mean"]) > 0 for r in rows if r["policy"] == "static")
    for r in rows:
        key = (r["world"], r["policy"], r["level"])
        assert r["seeds"] == 2
        for scope in ("all", "wl"):
            h = hand[(*key, scope)]
            for name in ("seed_max", "mean", "within", "coverage"):
                assert r[f"{scope}_{name}"] == pytest.approx(h[name], abs=1e-12), (key, name)
    table = format_summary(rows)
    assert table.count("\n") == len(rows) + 1 and "| reference | static | 8 |" in table


def test_summary_does_not_depend_on_the_order_of_the_records(study):
    """Workers finish in any order, and a file of parts holds them in that order: the
    summary must be the same to the bit (it was not: the seed means were summed, and tied
    workloads ranked, in the order of arrival)."""
    want = json.dumps(summarize_whatif_study(study[0]))
    for seed in range(8):
        records = list(study[0])
        random.Random(seed).shuffle(records)
        assert json.dumps(summarize_whatif_study(records)) == want


def test_summarize_cli(study, tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text("".join(json.dumps(part) + "\n" for part in study[1]), encoding="utf-8")
    cmd = [sys.executable, "-m", "dspark_obs.whatif.study"]
    proc = subprocess.run([*cmd, "--summarize", str(path), "--json"], capture_output=True,
                          text=True, check=True, timeout=120)  # fmt: skip
    out = json.loads(proc.stdout)
    assert out["cells"] == json.loads(json.dumps(summarize_whatif_study(study[0])))
    assert out["totals"] == json.loads(json.dumps(study_totals(study[0])))
    bad = subprocess.run([*cmd, "--summarize", str(tmp_path / "missing.jsonl")],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "cannot read study records" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_levels_of_small_batches_hold_as_many_request_steps(study):
    assert level_steps((2, 8), 30, 120) == [60, 30] and level_steps((2, 8), 30, None) == [30, 30]
    for r in study[0]:
        assert r["steps_per_level"] == {2: 60, 8: 30}[r["level"]]
        if r["workload"] == "all":
            assert r["request_steps_real"] == r["level"] * r["steps_per_level"]


def test_measured_standard_error_is_clustered_by_request(compact_run):
    """The SE of a measured cell against a plain recomputation over its requests."""
    from dspark_obs.analysis.load import step_tokens
    from dspark_obs.store import open_run

    run = open_run(compact_run[0])
    cells = measured_cells(run)
    steps = step_tokens(run).select("rank", "forward_ct", "bs", "seconds").collect()
    rows = run.requests().collect().join(steps, on=["rank", "forward_ct"])
    for (bs, workload), part in rows.group_by("bs", "workload"):
        sums: dict[str, list[float]] = {}
        for r in part.iter_rows(named=True):
            com, share = sums.setdefault(r["rid"], [0.0, 0.0])
            sums[r["rid"]] = [com + r["acc_len"], share + r["seconds"] / r["bs"]]
        total_share = sum(v[1] for v in sums.values())
        rate = sum(v[0] for v in sums.values()) / total_share
        se = sum((c - rate * s) ** 2 for c, s in sums.values()) ** 0.5 / total_share
        c = cells[(bs, workload)]
        assert c["tokens_per_s"] == pytest.approx(rate, rel=1e-12)
        assert c["tokens_per_s_se"] == pytest.approx(se, rel=1e-9) and se > 0


def test_totals_before_and_after_and_the_noise_floor(study):
    records = [r for r in study[0] if r["policy"] != "own"]
    totals = {(t["world"], t["scope"]): t for t in study_totals(study[0])}
    for scope, pick in (("all", lambda r: r["workload"] == "all"),
                        ("wl", lambda r: r["workload"] != "all")):  # fmt: skip
        part = [r for r in records if pick(r)]
        t = totals[("reference", scope)]
        assert t["cells"] == len(part)
        for key, pred in (("within", "tokens_per_s_predicted"),
                          ("within_same_steps", "tokens_per_s_same_steps")):  # fmt: skip
            hand = mean(abs(r[pred] / r["tokens_per_s_real"] - 1) <= TARGET_ERROR for r in part)
            assert t[key] == pytest.approx(hand)
        noise = [r["tokens_per_s_real_se"] / r["tokens_per_s_real"] for r in part]
        assert t["decidable"] == pytest.approx(mean(Z95_2 * x < TARGET_ERROR for x in noise))
        errors: dict[tuple, list[float]] = {}
        for r in part:
            key = (r["policy"], r["level"], r["workload"])
            errors.setdefault(key, []).append(
                r["tokens_per_s_predicted"] / r["tokens_per_s_real"] - 1
            )
        means = [abs(mean(v)) for v in errors.values()]
        assert t["seeds"] == 2 and t["mean_within"] == pytest.approx(
            mean(m <= TARGET_ERROR for m in means)
        )
        assert t["worst_mean"] == pytest.approx(max(means))
        own = [r for r in study[0] if r["policy"] == "own"]
        assert t["own_max"] == pytest.approx(
            max(abs(r["tokens_per_s_predicted"] / r["tokens_per_s_real"] - 1) for r in own)
        )
        assert t["own_max"] < 1e-9 and t["target_met"] is False  # two seeds, not ten
    text = format_totals(study_totals(study[0]), study_noise(study[0]))
    assert "| reference | all |" in text and "| reference | 2 | 60 | all |" in text
