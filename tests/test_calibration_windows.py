"""The stored run's calibration histograms, read in windows and folded a part at a time,
against one `CalibrationAccumulator.update` per workload over the whole table, by both
folds: numpy's and the compiled one (`aggregates/_rowfold.c`)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dspark_obs.aggregates import rows
from dspark_obs.analysis import reliability
from dspark_obs.calibration import CalibrationAccumulator, prefix_labels
from dspark_obs.store import Run, open_run
from dspark_obs.store.layout import in_memory

INTEGER = ("count", "target_sum", "fine_pos", "fine_neg")
FLOAT = ("pred_sum", "sq_err_sum")

#: numpy's fold, and the compiled one where it was built (tests/test_extensions.py fails
#: the build's absence where CI requires it)
FOLDS = [
    pytest.param(False, id="numpy"),
    pytest.param(
        True,
        id="compiled",
        marks=pytest.mark.skipif(rows._rowfold is None, reason="the C fold is not built"),
    ),
]


def assert_same(mine: CalibrationAccumulator, want: CalibrationAccumulator) -> None:
    for field in INTEGER:
        assert np.array_equal(getattr(mine, field), getattr(want, field)), field
    for field in FLOAT:
        np.testing.assert_allclose(getattr(mine, field), getattr(want, field), rtol=1e-12)


def expected(df: pl.DataFrame, gamma: int) -> dict[str, dict]:
    known = df.select(pl.coalesce("ceiling", "shadow_ceiling").fill_null(-1)).to_series()
    labels, labelled = prefix_labels(
        df["correct_drafts"].to_numpy(), df["window"].to_numpy(), known.to_numpy(), gamma
    )
    raw = np.cumprod(1.0 / (1.0 + np.exp(-df["confidence_logits"].to_numpy())), axis=1)
    out: dict[str, dict] = {"survival": {}, "raw": {}}
    workload = df["workload"].to_numpy()
    for name in sorted(set(workload)):
        rows = workload == name
        for stage, pred in (("survival", df["survival"].to_numpy()), ("raw", raw)):
            acc = CalibrationAccumulator(gamma)
            out[stage][name] = acc.update(pred[rows], labels[rows], labelled[rows])
    return out


@pytest.mark.parametrize("compiled", FOLDS)
@pytest.mark.parametrize("fold_rows", [1, 97, 1 << 15])
def test_windows_equal_one_accumulator_per_workload(compact_run, monkeypatch, fold_rows, compiled):
    run_dir, _ = compact_run
    run = open_run(run_dir)
    df = in_memory(pl.read_parquet(run_dir / "requests" / "*.parquet"))
    # several windows, and (but for the largest) several folds in each
    monkeypatch.setattr(reliability, "WINDOW_ROWS", df.height // 4 + 1)
    monkeypatch.setattr(reliability, "FOLD_ROWS", fold_rows)
    got = reliability.calibration_histograms(run, compiled=compiled)
    want = expected(df, run.gamma)
    assert list(got) == ["survival", "raw"]
    for stage in want:
        assert list(got[stage]) == list(want[stage])
        for name, acc in want[stage].items():
            assert acc.count.sum() > 0
            assert_same(got[stage][name], acc)


def awkward_window(gamma: int, n: int, seed: int) -> dict[str, np.ndarray]:
    """Rows of every label case (observed ceilings, censored rows with and without a whole
    window accepted), three groups with one absent, and predictions at and beyond the
    edges: 0, 1, infinities, NaN in the middle of a row, logits that saturate."""
    rng = np.random.default_rng(seed)
    window = rng.integers(0, gamma + 1, n)
    accepted = np.minimum(rng.integers(0, gamma + 1, n), window)
    known = np.where(rng.random(n) < 0.5, rng.integers(0, gamma + 1, n), -1)
    group = rng.choice([0, 2, 3], n)
    pred = rng.random((n, gamma))
    edges = np.array([0.0, 1.0, np.inf, -np.inf, np.nan, 1e-300, 1 - 1e-17, 40.0, -800.0])
    spots = rng.random((n, gamma)) < 0.2
    pred[spots] = rng.choice(edges, int(spots.sum()))
    pred[: n // 10, 0] = np.nan  # some rows record nothing at position 0
    return {"group": group, "correct_drafts": accepted, "window": window, "known": known,
            "pred": pred}  # fmt: skip


@pytest.mark.parametrize("compiled", FOLDS)
@pytest.mark.parametrize("raw", [False, True], ids=["survival", "raw"])
def test_fold_of_awkward_rows_is_the_accumulators(compiled, raw):
    """Both folds, straight on a window, against one accumulator per group: the label
    rule's every case and predictions no run validated (NaN skipped, the rest clipped)."""
    gamma = 7
    rows_ = awkward_window(gamma, 5000, seed=3)
    totals = reliability._Totals(gamma, 15, 1024, raw, reliability.compiled_fold(compiled))
    assert totals.add(rows_, "pred") is True
    pred = rows_["pred"]
    if raw:
        with np.errstate(over="ignore"):
            pred = np.cumprod(1.0 / (1.0 + np.exp(-pred)), axis=1)
    labels, labelled = prefix_labels(
        rows_["correct_drafts"], rows_["window"], rows_["known"], gamma
    )
    labelled &= ~np.isnan(pred)
    got = dict(totals.accumulators())
    assert sorted(got) == [0, 2, 3]
    for g, mine in got.items():
        at = rows_["group"] == g
        want = CalibrationAccumulator(gamma).update(
            np.where(labelled, np.clip(pred, 0.0, 1.0), 0.5)[at], labels[at], labelled[at]
        )
        assert want.count.sum() > 0
        assert_same(mine, want)


@pytest.mark.parametrize("compiled", FOLDS)
def test_a_window_without_position_zero_says_so(compiled):
    rows_ = awkward_window(7, 50, seed=4)
    rows_["pred"][:, 0] = np.nan
    totals = reliability._Totals(7, 15, 1024, False, reliability.compiled_fold(compiled))
    assert totals.add(rows_, "pred") is False


@pytest.mark.skipif(rows._rowfold is None, reason="the C fold is not built")
@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("window", 8, "window outside"),
        ("correct_drafts", -1, "accepted outside"),
        ("known", 9, "ceiling outside"),
        ("group", 7, "group outside"),
        ("group", -1, "group outside"),
    ],
)
def test_compiled_fold_refuses_a_bad_row_with_nothing_counted(column, value, message):
    rows_ = awkward_window(7, 200, seed=5)
    rows_[column][150] = value
    totals = reliability._Totals(7, 15, 1024, False, rows._rowfold)
    totals._grow(4)
    with pytest.raises(ValueError, match=message):
        rows._rowfold.histograms(
            *totals.sums.values(), rows_["group"], rows_["correct_drafts"], rows_["window"],
            rows_["known"], rows_["pred"], 7, 15, 1024, 1e-8, False,
        )  # fmt: skip
    assert all(not v.any() for v in totals.sums.values())


def test_a_stage_no_row_records_is_left_out(compact_run, monkeypatch):
    run_dir, _ = compact_run
    scan_parts = Run.scan_parts

    def without_logits(run: Run, table: str) -> list[pl.LazyFrame]:
        frames = scan_parts(run, table)
        dtype = frames[0].collect_schema()["confidence_logits"]
        return [f.with_columns(pl.lit(None, dtype).alias("confidence_logits")) for f in frames]

    monkeypatch.setattr(Run, "scan_parts", without_logits)
    assert list(reliability.calibration_histograms(open_run(run_dir))) == ["survival"]
