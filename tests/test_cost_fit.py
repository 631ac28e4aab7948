"""`dspark-obs cost fit`: the refitted step-cost table must be SGLang's least squares, exactly.

Checked three ways: a run whose times come without noise from a known table
must give that table back; on a simulated run the written table must be a
least-squares solution of an independent per-step solve (numpy lstsq over
per-step design rows) and land near the table that generated the times; and the
CLI must write a table `run --cost-table` accepts, plots that are not blank,
and one-line errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.image
import numpy as np
import polars as pl
import pytest

from dspark_obs.analysis.cost_canonical import BIAS_FLOOR, canonical_table, nonnegative_lstsq
from dspark_obs.analysis.cost_fit import CostFitError, fit_cost_table, interp_expr
from dspark_obs.domain.cost_table import AdditiveCostTable, load_cost_table
from dspark_obs.domain.step_cost import M_BIN
from dspark_obs.report.figures.cost import cost_figures, sample_steps
from dspark_obs.store import RunWriter, open_run
from dspark_obs.telemetry.batch import StepBatch

from .conftest import cli

KNOWN = AdditiveCostTable(
    bias_seconds=0.002,
    bs_probes=[1, 8, 32, 64],
    alpha_seconds=[0.0005, 0.0006, 0.0010, 0.0015],
    m_probes=[64, 128, 256, 512, 1024],
    theta_seconds=[0.0050, 0.0051, 0.0053, 0.0060, 0.0080],
)


def write_steps(path: Path, steps, manifest: dict | None = None) -> Path:
    """A run of step-only records: (bs, verify tokens, step_gpu_ms, predicted_step_ms)."""
    with RunWriter(path, {"gamma": 7, "mode": "compact", **(manifest or {})}) as w:
        for i, (bs, m, gpu_ms, pred_ms) in enumerate(steps):
            w.append(
                StepBatch(
                    forward_ct=i,
                    gamma=7,
                    mode="compact",
                    bs=bs,
                    num_verify_tokens=m,
                    step_gpu_ms=gpu_ms,
                    predicted_step_ms=pred_ms,
                    has_reqs=False,
                )
            )
    return path


def table_dict(t: AdditiveCostTable) -> dict:
    return json.loads(t.to_json())


def hat(x: np.ndarray, probes) -> np.ndarray:
    """Interpolation weights by searchsorted (not np.interp), clamped past the ends."""
    p = np.asarray(probes, dtype=np.float64)
    x = np.clip(np.asarray(x, dtype=np.float64), p[0], p[-1])
    out = np.zeros((len(x), len(p)))
    if len(p) == 1:
        out[:, 0] = 1.0
        return out
    k = np.clip(np.searchsorted(p, x, side="right") - 1, 0, len(p) - 2)
    t = (x - p[k]) / (p[k + 1] - p[k])
    rows = np.arange(len(x))
    out[rows, k] += 1.0 - t
    out[rows, k + 1] += t
    return out


def coef_of(t: AdditiveCostTable) -> np.ndarray:
    return np.array([t.bias_seconds, *t.alpha_seconds, *t.theta_seconds])


# ---------------------------------------------------------------- (a) exact recovery


@pytest.fixture(scope="module")
def exact_run(tmp_path_factory) -> Path:
    steps = []
    for bs in (1, 4, 8, 16, 32, 48, 64):
        for k in range(18):
            m = int((k + 0.5) * M_BIN)  # cell middles: 32, 96, ..., 1120
            if m < bs:
                continue
            y = float(KNOWN.step_seconds(bs, m - bs)) * 1e3
            steps += [(bs, m, y, y)] * (1 + (bs + k) % 3)
    path = tmp_path_factory.mktemp("cost") / "exact"
    return write_steps(path, steps, {"cost_table": table_dict(KNOWN)})


def test_exact_recovery(exact_run):
    fit = fit_cost_table(open_run(exact_run))
    assert (fit.bs_probes_source, fit.m_probes_source) == ("manifest", "manifest")
    assert fit.fitted.r2 == pytest.approx(1.0, abs=1e-9)
    assert fit.ols.r2 == pytest.approx(1.0, abs=1e-9)
    assert fit.fitted.rms_seconds < 1e-12 and fit.fitted.rel_error_median < 1e-9
    assert not fit.constrained
    # the canonical split of the known table: both curves start at 0
    t = fit.table
    assert t.bs_probes == KNOWN.bs_probes and t.m_probes == KNOWN.m_probes
    assert t.bias_seconds == pytest.approx(0.002 + 0.0005 + 0.0050, abs=1e-12)
    np.testing.assert_allclose(t.alpha_seconds, np.array(KNOWN.alpha_seconds) - 0.0005, atol=1e-12)
    np.testing.assert_allclose(t.theta_seconds, np.array(KNOWN.theta_seconds) - 0.0050, atol=1e-12)
    # predictions everywhere, inside and past the probes
    bs = np.arange(1, 100)[:, None]
    m = np.arange(1, 3000, 7)[None, :]
    bs, m = np.broadcast_arrays(bs, m)
    np.testing.assert_allclose(
        t.step_seconds(bs, m - bs), KNOWN.step_seconds(bs, m - bs), rtol=1e-9
    )
    # the run's own table was KNOWN too
    assert fit.own is not None and fit.own.r2 == pytest.approx(1.0, abs=1e-9)


def test_per_step_frame_is_the_table_evaluated(exact_run):
    fit = fit_cost_table(open_run(exact_run))
    df = fit.per_step.collect()
    assert df.height == fit.steps
    want = fit.table.step_seconds(df["bs"].to_numpy(), (df["m"] - df["bs"]).to_numpy()) * 1e3
    np.testing.assert_allclose(df["fitted_ms"].to_numpy(), want, rtol=1e-12)
    np.testing.assert_allclose(df["residual_ms"].to_numpy(), 0.0, atol=1e-9)


def test_interp_expr_matches_np_interp():
    rng = np.random.default_rng(3)
    xp = [1.0, 8.0, 32.0, 64.0, 256.0]
    fp = rng.random(5)
    x = np.concatenate([rng.uniform(-10, 400, 500), xp])
    got = pl.DataFrame({"x": x}).select(y=interp_expr(pl.col("x"), xp, fp))["y"].to_numpy()
    np.testing.assert_allclose(got, np.interp(x, xp, fp), rtol=1e-14, atol=1e-15)
    one = pl.DataFrame({"x": x}).select(y=interp_expr(pl.col("x"), [4], [0.5]))["y"]
    assert (one == 0.5).all()


def test_canonical_table_flat_past_the_data_and_bias_floor():
    """Probes no step reaches stay flat at the last fitted value; where no least-squares
    solution is valid, the table is the nearest valid one."""
    bs_p, m_p = [1, 8, 32, 64], [64, 128, 256, 512]
    # cells at bs 8 and 32, M 96 and 160 only: alpha(1), alpha(64), theta(512) are free
    bs = np.array([8.0, 8, 32, 32])
    m = np.array([96.0, 160, 96, 160])
    x = np.hstack([np.ones((4, 1)), hat(bs, bs_p), hat(m, m_p)])
    y = np.array([0.010, 0.011, 0.012, 0.013])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    table, constrained = canonical_table(coef, bs_p, m_p, x)
    assert not constrained
    np.testing.assert_allclose(table.step_seconds(bs, m - bs), x @ coef, rtol=1e-12)
    assert table.alpha_seconds[0] == pytest.approx(table.alpha_seconds[1], abs=1e-15)
    assert table.alpha_seconds[3] == pytest.approx(table.alpha_seconds[2], abs=1e-15)
    assert table.theta_seconds[3] == pytest.approx(table.theta_seconds[2], abs=1e-15)
    assert min(table.alpha_seconds) == 0.0 and min(table.theta_seconds) == 0.0
    # cells that a negative time fits best: the nearest valid table is the cheapest one
    low, constrained = canonical_table(np.array([-0.02, *[0.0] * 4, *[0.001] * 4]), bs_p, m_p, x)
    assert constrained
    assert low.bias_seconds == pytest.approx(BIAS_FLOOR, abs=1e-15)
    assert max(low.alpha_seconds) < 1e-15 and max(low.theta_seconds) < 1e-15


def test_nonnegative_lstsq_is_scipys():
    """Lawson and Hanson's active set against scipy's, on designs with free columns."""
    from scipy.optimize import nnls

    rng = np.random.default_rng(4)
    for trial in range(40):
        rows, cols = int(rng.integers(3, 30)), int(rng.integers(1, 15))
        a = rng.normal(size=(rows, cols)) * rng.uniform(0.1, 30.0)
        a[:, rng.random(cols) < 0.2] = 0.0
        b = rng.normal(size=rows)
        ours = nonnegative_lstsq(a, b)
        theirs, _ = nnls(a, b)
        assert (ours >= 0).all(), trial
        np.testing.assert_allclose(
            np.linalg.norm(a @ ours - b), np.linalg.norm(a @ theirs - b), rtol=1e-9, atol=1e-12
        )


def test_a_loosely_pinned_probe_does_not_shift_every_prediction():
    """An H200 run's shape: each batch size at one verify size, the largest batch's last
    few steps in a cell that reaches just past the next-to-last M probe, and a step time
    that dips there. The least squares send that probe far below 0; the table written is
    the valid one nearest to the cells (checked against scipy's bounded least squares),
    not the least squares lifted as a whole."""
    from scipy.optimize import lsq_linear

    bs_p, m_p = [1, 8, 32, 64, 128, 256], [1, 64, 128, 256, 512, 1024, 2048]
    # the run's (bs, M-bin) cells: batch size, the bin's middle M, steps, mean ms
    bs = np.array([1.0, 8, 8, 32, 32, 64, 64, 128, 128, 256, 256])
    m = np.array([32.0, 32, 96, 160, 224, 352, 416, 544, 672, 928, 1056])
    n = np.array([400.0, 29, 371, 16, 384, 398, 2, 368, 32, 388, 12])
    y = np.array([9.34, 9.54, 9.06, 9.84, 10.15, 9.97, 9.68, 16.21, 16.37, 29.4, 28.18]) * 1e-3
    weighted = np.hstack([np.ones((11, 1)), hat(bs, bs_p), hat(m, m_p)]) * np.sqrt(n)[:, None]
    coef, *_ = np.linalg.lstsq(weighted, y * np.sqrt(n), rcond=None)
    assert coef[-1] < -0.02  # the least squares' theta(2048)
    table, constrained = canonical_table(coef, bs_p, m_p, weighted)
    assert constrained
    assert table.bias_seconds >= BIAS_FLOOR
    assert min(table.alpha_seconds) >= 0 and min(table.theta_seconds) >= 0
    predicted = table.step_seconds(bs, m - bs)
    lower = np.r_[BIAS_FLOOR, np.zeros(weighted.shape[1] - 1)]
    best = lsq_linear(weighted, y * np.sqrt(n), bounds=(lower, np.inf), tol=1e-14).x
    sse = (((predicted - y) * np.sqrt(n)) ** 2).sum()
    best_sse = ((weighted @ best - y * np.sqrt(n)) ** 2).sum()
    assert sse == pytest.approx(best_sse, rel=1e-4)
    # the cells of hundreds of steps within 0.05 ms, the dip within 1 ms (lifting bias
    # would put every cell about 35 ms high)
    assert np.abs(predicted - y)[n > 300].max() < 0.05e-3
    assert np.abs(predicted - y).max() < 1e-3


# ------------------------------------------------------ (b) a real simulated run


def step_arrays(run_dir: Path) -> dict[str, np.ndarray]:
    df = (
        pl.read_parquet(f"{run_dir}/steps/*.parquet")
        .filter(
            (pl.col("bs") > 0)
            & (pl.col("num_verify_tokens") > 0)
            & (pl.col("step_gpu_ms").fill_null(-1.0) > 0)
        )
        .select("bs", "num_verify_tokens", "step_gpu_ms", "predicted_step_ms")
    )
    return {c: df[c].to_numpy().astype(np.float64) for c in df.columns}


def test_fit_is_per_step_least_squares(compact_run):
    run_dir, _ = compact_run
    run = open_run(run_dir)
    fit = fit_cost_table(run)
    s = step_arrays(run_dir)
    bs, tokens = s["bs"], s["num_verify_tokens"]
    y = s["step_gpu_ms"] / 1e3
    assert fit.steps == len(y) and fit.cells >= 2
    centre = (tokens // M_BIN + 0.5) * M_BIN
    t = fit.table
    x = np.hstack([np.ones((len(y), 1)), hat(bs, t.bs_probes), hat(centre, t.m_probes)])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    # the written table predicts every step (M at its bin's middle) as the per-step solve
    np.testing.assert_allclose(t.step_seconds(bs, centre - bs), x @ coef, rtol=1e-9)
    np.testing.assert_allclose(x @ coef_of(t), x @ coef, rtol=1e-9)
    # ... and is itself a least-squares solution: the normal equations hold
    grad = x.T @ (y - x @ coef_of(t))
    assert np.abs(grad).max() <= 1e-9 * np.abs(x.T @ y).max()
    sse = float(((y - x @ coef) ** 2).sum())
    sst = float(((y - y.mean()) ** 2).sum())
    assert fit.ols.r2 == pytest.approx(1 - sse / sst, rel=1e-9)
    assert fit.ols.rms_seconds == pytest.approx(np.sqrt(sse / len(y)), rel=1e-9)
    # the reported errors are the written table's, per step at its own M
    pred = t.step_seconds(bs, tokens - bs)
    rel = np.abs(y - pred) / y
    assert fit.fitted.r2 == pytest.approx(1 - ((y - pred) ** 2).sum() / sst, rel=1e-9)
    assert fit.fitted.rms_seconds == pytest.approx(np.sqrt(((y - pred) ** 2).mean()), rel=1e-9)
    assert fit.fitted.rel_error_median == pytest.approx(np.median(rel), rel=1e-9)
    assert fit.fitted.rel_error_mean == pytest.approx(rel.mean(), rel=1e-9)
    own = s["predicted_step_ms"] / 1e3
    own_rel = np.abs(y - own) / y
    assert fit.own is not None and fit.own.steps == len(y)
    assert fit.own.rel_error_mean == pytest.approx(own_rel.mean(), rel=1e-9)
    assert fit.own.r2 == pytest.approx(1 - ((y - own) ** 2).sum() / sst, rel=1e-9)
    # the times were simulated from the manifest's table (3% noise): the fit lands near it
    true = AdditiveCostTable(**run.manifest["cost_table"])
    err = np.abs(pred / true.step_seconds(bs, tokens - bs) - 1)
    assert err.max() < 0.05, err.max()
    assert np.average(err) < 0.02


def test_probe_defaults_cover_the_observed_range(tmp_path, compact_run):
    run_dir, _ = compact_run
    s = step_arrays(run_dir)
    rows = [
        (int(b), int(m), float(g), None)
        for b, m, g in zip(s["bs"], s["num_verify_tokens"], s["step_gpu_ms"], strict=True)
    ]
    fit = fit_cost_table(open_run(write_steps(tmp_path / "no_manifest_table", rows)))
    assert (fit.bs_probes_source, fit.m_probes_source) == ("default", "default")
    assert fit.table.bs_probes[0] <= s["bs"].min() and fit.table.bs_probes[-1] >= s["bs"].max()
    assert fit.table.bs_probes == [4, 8, 16, 32]  # observed bs: 4 and 32
    # observed M 32..256 (cell middles up to 288): below the first default probe, clamped
    assert fit.table.m_probes == [64, 128, 256, 512]
    assert fit.own is None
    given = fit_cost_table(open_run(run_dir), bs_probes=[2, 16, 64], m_probes=[64, 256])
    assert given.table.bs_probes == [2, 16, 64] and given.bs_probes_source == "option"
    with pytest.raises(CostFitError, match="strictly increasing"):
        fit_cost_table(open_run(run_dir), m_probes=[256, 64])


def test_figures_sample_and_title(compact_run):
    fit = fit_cost_table(open_run(compact_run[0]))
    df, stride = sample_steps(fit, limit=50)
    assert stride == -(-fit.steps // 50) and df.height <= 50
    figs = cost_figures(fit, limit=50)
    assert set(figs) == {"cost_surface", "cost_scatter", "cost_residuals"}
    for fig in figs.values():
        (ax,) = fig.axes
        assert ax.get_title() and ax.get_xlabel() and ax.get_ylabel()
        assert ax.get_legend() is not None
    assert f"1 step in {stride} of {fit.steps:,}" in figs["cost_scatter"].axes[0].get_title()
    assert "(ms)" in figs["cost_residuals"].axes[0].get_ylabel()


# ------------------------------------------------------------------ (c) the CLI


def test_cli_writes_a_table_the_runtime_uses(tmp_path, compact_run):
    run_dir, _ = compact_run
    out, png, plots = tmp_path / "table.json", tmp_path / "fit.png", tmp_path / "plots"
    proc = cli("cost", "fit", str(run_dir), "--out", str(out), "--plot", str(png), "--json")
    report = json.loads(proc.stdout)
    table = load_cost_table(out)
    assert out.read_text() == table.to_json()
    assert report["table"] == table_dict(table)
    assert report["fit"]["steps"] == report["fit"]["fitted"]["steps"] > 0
    assert report["fit"]["own"]["steps"] > 0 and report["plots"] == [str(png)]
    pixels = matplotlib.image.imread(png)
    assert pixels.shape[0] > 500 and pixels[..., :3].std() > 0.05

    proc = cli("cost", "fit", str(run_dir), "--out", str(out), "--plot-dir", str(plots))
    assert "refitted table" in proc.stdout and "run's own table" in proc.stdout
    for stem in ("cost_surface", "cost_scatter", "cost_residuals"):
        assert matplotlib.image.imread(plots / f"{stem}.png")[..., :3].std() > 0.05

    again = tmp_path / "again"
    proc = cli(
        "run",
        "--cost-table",
        str(out),
        "--out",
        str(again),
        "--concurrency",
        "4,32",
        "--steps-per-level",
        "20",
        "--sts-warmup-steps",
        "20",
        "--max-new-tokens",
        "100",
        "--quiet",
        "--json",
    )
    assert json.loads(proc.stdout)["overall"]["steps"] == 40
    assert open_run(again).manifest["cost_table"] == table_dict(table)


# ---------------------------------------------------------------- (d) errors


def assert_one_line_error(proc, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_cli_errors(tmp_path, compact_run):
    out = str(tmp_path / "t.json")
    untimed = write_steps(tmp_path / "untimed", [(8, 64, None, 5.0), (32, 256, None, 6.0)])
    assert_one_line_error(
        cli("cost", "fit", str(untimed), "--out", out, check=False),
        "no measured step times (step_gpu_ms",
        "step_gpu_time",
    )
    one_cell = write_steps(tmp_path / "one_cell", [(8, 64, 5.0, None), (8, 70, 5.1, None)])
    assert_one_line_error(
        cli("cost", "fit", str(one_cell), "--out", out, check=False), "at least 2"
    )
    with RunWriter(tmp_path / "empty", {"gamma": 7}):
        pass
    assert_one_line_error(
        cli("cost", "fit", str(tmp_path / "empty"), "--out", out, check=False), "no steps table"
    )
    run_dir = str(compact_run[0])
    assert_one_line_error(
        cli("cost", "fit", run_dir, "--out", out, "--m-probes", "128,64", check=False),
        "--m-probes",
        "strictly increasing",
    )
    assert_one_line_error(
        cli("cost", "fit", run_dir, "--out", out, "--bs-probes", "1,x", check=False),
        "--bs-probes",
    )
    assert not Path(out).exists()
