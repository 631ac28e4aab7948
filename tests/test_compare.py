"""`dspark-obs compare`: the cluster bootstrap, Holm, and the A/B of real runs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import matplotlib.image
import numpy as np
import polars as pl
import pytest

from dspark_obs.analysis import bootstrap as boot
from dspark_obs.analysis.bootstrap import (
    bootstrap_delta,
    holm,
    holm_intervals,
    p_value,
    replicate_deltas,
)
from dspark_obs.analysis.compare import ROW_KEYS
from dspark_obs.analysis.verdict import verdict
from dspark_obs.store import open_run
from dspark_obs.store.layout import in_memory
from dspark_obs.whatif.trim_cost import TRIM_COST_KEYS, trim_cost

from .conftest import cli
from .test_report import SGLANG_DUMP

RUN_ARGS = ["--steps-per-level", "40", "--sts", "none", "--max-new-tokens", "200", "--quiet"]

# clusters (e.g. requests): numerator and denominator sums per arm; the last two
# keys exist in one arm only, so the other arm has zeros there
NUM_A = np.array([12, 30, 7, 0, 22, 15, 9, 40, 3, 18, 5, 0], dtype=float)
DEN_A = np.array([4, 6, 2, 1, 5, 3, 3, 8, 1, 4, 2, 0], dtype=float)
NUM_B = np.array([10, 25, 9, 2, 20, 11, 8, 30, 4, 15, 0, 6], dtype=float)
DEN_B = np.array([4, 6, 2, 1, 5, 3, 3, 8, 1, 4, 0, 2], dtype=float)


def _brute_force(reps: int, seed: int) -> np.ndarray:
    """One replicate at a time: draw n keys, sum each arm's clusters, take B/B - A/A."""
    rng = np.random.default_rng(seed)
    n = NUM_A.size
    out = []
    for _ in range(reps):
        idx = rng.integers(0, n, size=n)
        ra = NUM_A[idx].sum() / DEN_A[idx].sum()
        rb = NUM_B[idx].sum() / DEN_B[idx].sum()
        out.append(rb - ra)
    return np.array(out)


def test_bootstrap_matches_a_per_replicate_loop(monkeypatch):
    expected = _brute_force(2000, seed=7)
    res = bootstrap_delta(NUM_A, DEN_A, NUM_B, DEN_B, reps=2000, rng=np.random.default_rng(7))
    assert res.a == pytest.approx(NUM_A.sum() / DEN_A.sum())
    assert res.b == pytest.approx(NUM_B.sum() / DEN_B.sum())
    assert res.delta == pytest.approx(res.b - res.a)
    assert res.rel_delta == pytest.approx(res.delta / res.a)
    lo, hi = np.percentile(expected, [2.5, 97.5])
    assert res.ci == pytest.approx((lo, hi), rel=1e-12, abs=1e-12)
    assert res.p == pytest.approx(min(1.0, 2 * min(np.mean(expected <= 0), np.mean(expected >= 0))))
    assert 0.0 <= res.p <= 1.0
    # chunking replicates to bound memory changes nothing
    monkeypatch.setattr(boot, "_CHUNK_ELEMENTS", 4 * NUM_A.size * 3)
    chunked = replicate_deltas(NUM_A, DEN_A, NUM_B, DEN_B, reps=2000, rng=np.random.default_rng(7))
    np.testing.assert_allclose(chunked, expected, rtol=1e-12, atol=1e-12)


def test_bootstrap_agrees_with_scipy_percentile_interval():
    stats = pytest.importorskip("scipy.stats")

    def delta(na, da, nb, db, axis=-1):
        return nb.sum(axis=axis) / db.sum(axis=axis) - na.sum(axis=axis) / da.sum(axis=axis)

    ref = stats.bootstrap(
        (NUM_A, DEN_A, NUM_B, DEN_B),
        delta,
        paired=True,
        vectorized=True,
        n_resamples=20000,
        method="percentile",
        rng=np.random.default_rng(1),
    ).confidence_interval
    ours = bootstrap_delta(NUM_A, DEN_A, NUM_B, DEN_B, reps=20000, rng=np.random.default_rng(2))
    width = ref.high - ref.low
    assert ours.ci[0] == pytest.approx(ref.low, abs=0.05 * width)
    assert ours.ci[1] == pytest.approx(ref.high, abs=0.05 * width)


def test_identical_arms_give_zero_and_no_difference():
    res = bootstrap_delta(NUM_A, DEN_A, NUM_A, DEN_A, reps=500, rng=np.random.default_rng(0))
    assert res.delta == 0.0
    assert res.ci == (0.0, 0.0)
    assert res.p == 1.0
    row = {
        "delta": res.delta,
        "ci_holm": list(res.ci),
        "rel_delta": res.rel_delta,
        "unit": "drafts",
        "significant": False,
    }
    assert verdict(row) == "no difference"


def test_p_value_tails():
    assert p_value(np.array([-1.0, 0.0, 1.0, 2.0])) == 1.0  # zero counts in both tails
    assert p_value(np.array([1.0, 2.0, 3.0, -1.0])) == 0.5
    assert p_value(np.array([1.0, 2.0, 3.0])) == 0.0


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04;
    # the running maximum lifts the last to 0.06
    adjusted = holm(np.array([0.01, 0.04, 0.03, 0.005]))
    np.testing.assert_allclose(adjusted, [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm(np.array([0.5, 0.6])), [1.0, 1.0])
    assert holm(np.array([])).size == 0


def test_verdict_wording():
    row = {
        "delta": -7.21,
        "rel_delta": -0.253,
        "ci_holm": [-7.4, -7.0],
        "unit": "ms",
        "significant": True,
    }
    assert verdict(row) == "B lower by 7.21 ms (-25.3%), Holm 95% CI [-7.4, -7.0]"
    row.update(delta=0.004, ci_holm=[-0.02, 0.03], significant=False)
    assert verdict(row) == "no significant difference (Holm 95% CI [-0.020, +0.030])"
    assert verdict({"delta": None, "ci_holm": None, "reason": "B has no known ceiling"}) == (
        "not compared: B has no known ceiling"
    )


# --- real runs ------------------------------------------------------------------------


def _run(root: Path, name: str, *args: str) -> Path:
    out = root / name
    cli("run", "--out", str(out), "--json", *RUN_ARGS, *args)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("compare")
    small = ["--concurrency", "8,32", "--mode", "compact"]
    big = ["--concurrency", "256", "--steps-per-level", "60"]
    return {
        "same1": _run(root, "same1", *small, "--shadow", "cap-accept"),
        "same2": _run(root, "same2", *small, "--shadow", "cap-accept"),
        "gamma5": _run(root, "gamma5", *small, "--gamma", "5"),
        "two_workloads": _run(root, "two", *small, "--workloads", "gsm8k,arena"),
        "static": _run(root, "static", *big, "--mode", "static"),
        "compact": _run(root, "compact", *big, "--mode", "compact"),
    }


def _compare(a: Path, b: Path, *args: str) -> dict:
    return json.loads(cli("compare", str(a), str(b), "--json", *args).stdout)


def _row(result: dict, metric: str, *, workload=None, bs=None) -> dict:
    (row,) = [
        r
        for r in result["rows"]
        if r["metric"] == metric and r["workload"] == workload and r["bs"] == bs
    ]
    return row


def test_same_seed_same_config_no_difference_anywhere(runs):
    result = _compare(runs["same1"], runs["same2"])
    assert result["config_diff"] == []
    assert result["findings"] == []
    assert result["batch_sizes"] == [8, 32]
    assert result["tested"] == len(result["rows"])  # the shadow gives every row a value
    for r in result["rows"]:
        assert r["delta"] == 0.0 and r["ci"] == [0.0, 0.0], r
        assert r["p"] == 1.0 and r["p_adjusted"] == 1.0
        assert not r["significant"]
        assert r["verdict"] == "no difference"
    text = cli("compare", str(runs["same1"]), str(runs["same2"])).stdout
    assert "no significant difference" in text


def test_static_vs_compact_at_256(runs):
    a, b = runs["static"], runs["compact"]
    result = _compare(a, b)
    assert {"key": "mode", "a": "static", "b": "compact"} in result["config_diff"]
    assert any("modes differ" in n for n in result["notes"])

    steps = {k: pl.read_parquet(p / "steps" / "*.parquet") for k, p in (("a", a), ("b", b))}
    reqs = {
        k: in_memory(pl.read_parquet(p / "requests" / "*.parquet")) for k, p in (("a", a), ("b", b))
    }
    ms = {k: s.filter(pl.col("bs") == 256)["step_gpu_ms"].mean() for k, s in steps.items()}
    step = _row(result, "step_ms", bs=256)
    assert step["a"] == pytest.approx(ms["a"], rel=1e-12)
    assert step["b"] == pytest.approx(ms["b"], rel=1e-12)
    assert step["delta"] == pytest.approx(ms["b"] - ms["a"], rel=1e-9)
    assert step["significant"] and step["p_adjusted"] < 0.05
    assert step["ci"][0] <= step["delta"] <= step["ci"][1]
    assert step["ci"][1] < 0  # compact is faster, and the interval excludes zero
    assert step["verdict"].startswith("B lower by ")

    window = _row(result, "mean_window", workload="overall")
    expected = reqs["b"]["window"].mean() - reqs["a"]["window"].mean()
    assert window["delta"] == pytest.approx(expected, rel=1e-9)
    assert window["delta"] < 0 and window["significant"] and window["ci"][1] < 0

    def throughput(k: str) -> float:
        s = steps[k].filter(pl.col("bs") == 256)
        tokens = reqs[k].join(s.select("rank", "forward_ct"), on=["rank", "forward_ct"])
        return tokens["acc_len"].sum() / (s["step_gpu_ms"].sum() / 1e3)

    tput = _row(result, "throughput_tokens_per_s", bs=256)
    assert tput["delta"] == pytest.approx(throughput("b") - throughput("a"), rel=1e-9)
    # compact has no ceiling of its own: not compared rather than a made-up number
    ceiling = _row(result, "mean_ceiling", workload="overall")
    assert ceiling["delta"] is None and ceiling["verdict"].startswith("not compared")
    assert any(f.startswith("bs 256 step time: B lower") for f in result["findings"])


def test_gamma_mismatch_refused_unless_allowed(runs):
    proc = cli("compare", str(runs["same1"]), str(runs["gamma5"]), check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "gamma" in lines[0]
    result = _compare(runs["same1"], runs["gamma5"], "--allow-mismatch")
    assert any("gamma" in n for n in result["notes"])
    assert {"key": "gamma", "a": 7, "b": 5} in result["config_diff"]


def test_workload_mismatch_refused_unless_allowed(runs):
    proc = cli("compare", str(runs["same1"]), str(runs["two_workloads"]), check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "workloads" in lines[0]
    result = _compare(runs["same1"], runs["two_workloads"], "--allow-mismatch")
    assert result["workloads"] == ["gsm8k", "arena"]
    assert any("poetry" in n for n in result["notes"])
    assert {r["workload"] for r in result["rows"]} == {"gsm8k", "arena", "overall", None}


def test_json_rows_have_documented_keys_and_bs_filter(runs):
    result = _compare(runs["same1"], runs["gamma5"], "--allow-mismatch", "--reps", "200")
    for key in ("a", "b", "reps", "seed", "workloads", "batch_sizes", "config_diff", "rows"):
        assert key in result
    assert result["reps"] == 200
    for r in result["rows"]:
        assert tuple(r) == ROW_KEYS
        if r["p"] is not None:
            assert 0.0 <= r["p"] <= r["p_adjusted"] <= 1.0
            assert len(r["ci"]) == 2 and r["ci"][0] <= r["ci"][1]
    only8 = _compare(
        runs["same1"], runs["gamma5"], "--allow-mismatch", "--reps", "200", "--bs", "8"
    )
    assert only8["batch_sizes"] == [8]
    assert {r["bs"] for r in only8["rows"]} == {None, 8}
    # a row's interval does not depend on which other rows were asked for
    assert _row(only8, "step_ms", bs=8)["ci"] == _row(result, "step_ms", bs=8)["ci"]


def test_out_writes_the_overlaid_figures(runs, tmp_path):
    out = tmp_path / "figures"
    proc = cli("compare", str(runs["static"]), str(runs["compact"]), "--out", str(out))
    pngs = sorted(out.glob("*.png"))
    assert [p.name.split("-", 1)[1] for p in pngs] == [
        "workloads.png",
        "verify-windows.png",
        "budget.png",
        "throughput.png",
        "step-time.png",
    ]
    for png in pngs:
        pixels = matplotlib.image.imread(png)[..., :3]
        assert pixels.std() > 0.02, png.name
    assert f"wrote 5 overlaid figures to {out}" in proc.stdout.replace("\n", "")


def test_holm_intervals_exclude_zero_exactly_for_the_rows_holm_rejects():
    """Many families of rows, some shifted off zero: a row is significant after Holm exactly
    when its Holm interval excludes zero, and that interval is at the level Holm used."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        m = int(rng.integers(1, 30))
        n = int(rng.integers(50, 2000))
        shifts = rng.normal(0, 2.5, m) * (rng.random(m) < 0.5)
        deltas = [np.sort(rng.normal(s, 1.0, n)) for s in shifts]
        p = np.array([p_value(d) for d in deltas])
        intervals, levels = holm_intervals(deltas, p, 0.05)
        significant = holm(p) < 0.05
        for sig, (lo, hi), d, level in zip(significant, intervals, deltas, levels, strict=True):
            assert sig == (lo > 0 or hi < 0), (p, lo, hi)
            # the order statistics a percentile interval at `level` takes
            share_below, share_above = np.mean(d < lo), np.mean(d > hi)
            assert share_below <= level / 2 and share_above <= level / 2
        # Holm's levels: the i-th smallest p is tested at alpha / (m - i + 1) until one is
        # kept, and tied p-values at the level of the first of them
        order = np.argsort(p, kind="stable")
        first_kept = next((i for i, k in enumerate(order) if not significant[k]), m)
        for k in order:
            first_tied = int(np.searchsorted(p[order], p[k], side="left"))
            assert levels[k] == pytest.approx(0.05 / (m - min(first_tied, first_kept)))


def test_metrics_that_differ_by_a_constant_get_one_interval(runs):
    """Committed tokens are accepted drafts plus the one token every step commits, so their
    deltas are equal; so are their intervals, their p-values and Holm's levels (the rows of a
    group resample the same requests). The table prints a p-value below 0.001 as such."""
    result = _compare(runs["static"], runs["compact"])
    for workload in [*result["workloads"], "overall"]:
        acc = _row(result, "mean_accepted", workload=workload)
        com = _row(result, "mean_committed", workload=workload)
        assert com["delta"] == pytest.approx(acc["delta"], abs=1e-12)
        for key in ("ci", "ci_holm"):
            assert com[key] == pytest.approx(acc[key], abs=1e-12), (workload, key)
        assert (com["p"], com["p_adjusted"], com["ci_holm_level"]) == (
            acc["p"],
            acc["p_adjusted"],
            acc["ci_holm_level"],
        )
    assert any(r["p"] == 0.0 for r in result["rows"])
    text = cli("compare", str(runs["static"]), str(runs["compact"])).stdout
    zero = [r for r in result["rows"] if r["metric"] == "mean_accepted" and r["p_adjusted"] == 0]
    assert zero
    for r in zero:
        (line,) = [x for x in text.splitlines() if x.startswith(f"│ {r['workload']} ") and
                   "mean accepted" in x]  # fmt: skip
        assert "│ <0.001 │" in line, line


def test_cost_of_trimming_per_run_side_by_side(runs):
    """Each run's cost of trimming is `whatif.trim_cost` of that run, in --json and in the
    table (A beside B at every level either run has)."""
    a, b = runs["static"], runs["same1"]
    result = _compare(a, b, "--reps", "50")
    assert result["trim_cost_missing"] == {"a": None, "b": None}
    for name, path in (("a", a), ("b", b)):
        got, expected = result["trim_cost"][name], trim_cost(open_run(path))
        assert [tuple(e) for e in got] == [TRIM_COST_KEYS] * len(expected)
        for g, e in zip(got, expected, strict=True):
            assert (g["level"], g["workload"]) == (e["level"], e["workload"])
            for key in TRIM_COST_KEYS[2:]:
                assert g[key] == pytest.approx(e[key], rel=1e-9), key
            assert g["net_tokens_per_s"] == pytest.approx(g["step_time_saved"] + g["accepted_lost"])
    for e in result["trim_cost"]["a"]:  # static trims nothing
        assert e["net_tokens_per_s"] == pytest.approx(0, abs=1e-9)
    text = cli("compare", str(a), str(b), "--reps", "50").stdout
    title = "cost of trimming against static, A and B"
    after = text[text.index(title) :].splitlines()[1:]
    table = list(itertools.takewhile(lambda line: line[:1] in "┏┃┡│├└", after))
    cells = [[c.strip() for c in line.split("│")[1:3]] for line in table if line[:1] == "│"]
    assert cells == [["8", "B"], ["32", "B"], ["256", "A"]]
    for entry in result["trim_cost"]["b"]:
        if entry["workload"] == "all":
            assert f"bs {entry['level']}: {entry['net_tokens_per_s']:+,.1f} tokens/s" in text


def test_a_run_with_nothing_to_predict_says_why(tmp_path):
    run = tmp_path / "ingested"
    cli("ingest", str(SGLANG_DUMP), "--out", str(run))
    proc = cli("compare", str(run), str(run), "--reps", "20")
    assert "A: no cost of trimming: " in proc.stdout and "no cost table" in proc.stdout
    assert "Traceback" not in proc.stderr
    result = _compare(run, run, "--reps", "20")
    assert result["trim_cost"] == {"a": None, "b": None}
    assert "no measured step times" in result["trim_cost_missing"]["b"]


def test_csv_has_every_row_of_the_json(runs):
    import io

    result = _compare(runs["static"], runs["compact"])
    text = cli("compare", str(runs["static"]), str(runs["compact"]), "--csv").stdout
    got = pl.read_csv(io.StringIO(text), infer_schema_length=None).to_dicts()
    assert len(got) == len(result["rows"])
    for row, want in zip(got, result["rows"], strict=True):
        assert (row["metric"], row["workload"], row["bs"]) == (
            want["metric"],
            want["workload"],
            want["bs"],
        )
        if want["delta"] is None:
            assert row["delta"] is None
        else:
            assert row["delta"] == pytest.approx(want["delta"], rel=1e-12)
        if want["ci_holm"]:
            assert [row["ci_holm.0"], row["ci_holm.1"]] == pytest.approx(want["ci_holm"])
        assert row["verdict"] == want["verdict"]
