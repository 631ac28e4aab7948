"""The stored run's calibration histograms, read in windows and folded a part at a time,
against one `CalibrationAccumulator.update` per workload over the whole table."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from dspark_obs.analysis import reliability
from dspark_obs.calibration import CalibrationAccumulator, prefix_labels
from dspark_obs.store import Run, open_run

INTEGER = ("count", "target_sum", "fine_pos", "fine_neg")
FLOAT = ("pred_sum", "sq_err_sum")


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


@pytest.mark.parametrize("fold_rows", [1, 97, 1 << 15])
def test_windows_equal_one_accumulator_per_workload(compact_run, monkeypatch, fold_rows):
    run_dir, _ = compact_run
    run = open_run(run_dir)
    df = pl.read_parquet(run_dir / "requests" / "*.parquet")
    # several windows, and (but for the largest) several folds in each
    monkeypatch.setattr(reliability, "WINDOW_ROWS", df.height // 4 + 1)
    monkeypatch.setattr(reliability, "FOLD_ROWS", fold_rows)
    got = reliability.calibration_histograms(run)
    want = expected(df, run.gamma)
    assert list(got) == ["survival", "raw"]
    for stage in want:
        assert list(got[stage]) == list(want[stage])
        for name, acc in want[stage].items():
            mine = got[stage][name]
            assert acc.count.sum() > 0
            for field in INTEGER:
                assert np.array_equal(getattr(mine, field), getattr(acc, field)), field
            for field in FLOAT:
                np.testing.assert_allclose(getattr(mine, field), getattr(acc, field), rtol=1e-12)


def test_a_stage_no_row_records_is_left_out(compact_run, monkeypatch):
    run_dir, _ = compact_run
    requests = Run.requests

    def without_logits(run: Run) -> pl.LazyFrame:
        frame = requests(run)
        dtype = frame.collect_schema()["confidence_logits"]
        return frame.with_columns(pl.lit(None, dtype).alias("confidence_logits"))

    monkeypatch.setattr(Run, "requests", without_logits)
    assert list(reliability.calibration_histograms(open_run(run_dir))) == ["survival"]
