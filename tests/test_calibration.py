"""Calibration room: labels, SGLang-style metrics and STS, each against independent code."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy.stats import rankdata

from dspark_obs.calibration import (
    TEMPERATURE_GRID,
    CalibrationAccumulator,
    StsCalibration,
    apply_sts,
    brier_score,
    expected_calibration_error,
    fit_sts,
    histogram_auroc,
    load_sts,
    position_metrics,
    prefix_labels,
    save_sts,
)
from dspark_obs.calibration.metrics import ece_rows

# ---------------------------------------------------------------- references


def loop_ece(pred, labels, num_bins=15):
    """Plain-Python ECE: group rows by bin one by one."""
    groups: dict[int, list[tuple[float, float]]] = {}
    for p, y in zip(pred, labels, strict=True):
        p = min(max(float(p), 1e-8), 1.0 - 1e-8)
        b = min(math.floor(p * num_bins), num_bins - 1)
        groups.setdefault(b, []).append((p, float(y)))
    total = sum(len(g) for g in groups.values())
    if total == 0:
        return math.nan
    err = 0.0
    for g in groups.values():
        mean_p = sum(p for p, _ in g) / len(g)
        mean_y = sum(y for _, y in g) / len(g)
        err += len(g) * abs(mean_p - mean_y)
    return err / total


def mann_whitney_auroc(pred, labels):
    """Exact AUROC from average ranks (ties count half)."""
    labels = np.asarray(labels, dtype=bool)
    ranks = rankdata(pred)
    n_pos, n_neg = labels.sum(), (~labels).sum()
    return (ranks[labels].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def loop_labels(accepted, window, ceiling, gamma):
    labels = np.zeros((len(accepted), gamma), dtype=bool)
    labelled = np.zeros((len(accepted), gamma), dtype=bool)
    for i, (a, w, c) in enumerate(zip(accepted, window, ceiling, strict=True)):
        for j in range(gamma):
            if c >= 0:
                labels[i, j], labelled[i, j] = j < c, True
            elif j < a:
                labels[i, j], labelled[i, j] = True, True
            elif a < w:
                labels[i, j], labelled[i, j] = False, True
    return labels, labelled


def torch_ece(probs, targets, num_bins):
    """SGLang's `expected_calibration_error`, transcribed in torch."""
    probs = probs.reshape(-1).to(torch.float64).clamp(1e-8, 1.0 - 1e-8)
    targets = targets.reshape(-1).to(torch.float64)
    total = probs.numel()
    if total == 0:
        return float("nan")
    idx = (probs * num_bins).long().clamp_(0, num_bins - 1)
    count = torch.zeros(num_bins, dtype=torch.float64).scatter_add_(0, idx, torch.ones_like(probs))
    pred_sum = torch.zeros(num_bins, dtype=torch.float64).scatter_add_(0, idx, probs)
    target_sum = torch.zeros(num_bins, dtype=torch.float64).scatter_add_(0, idx, targets)
    denom = count.clamp_min(1.0)
    return float(((pred_sum / denom - target_sum / denom).abs() * count).sum().item() / total)


def torch_sts(logits, labels, labelled, grid, num_bins=15):
    """SGLang's `fit_sts_temperatures` loop (strict `<`), restricted to labelled rows."""
    logits = torch.as_tensor(logits, dtype=torch.float64)
    targets = torch.as_tensor(labels, dtype=torch.float64)
    mask = torch.as_tensor(labelled, dtype=torch.bool)
    n, gamma = logits.shape
    at_one = torch.ones(n, dtype=torch.float64)
    fitted = torch.ones(n, dtype=torch.float64)
    temps, before, after = [], [], []
    for j in range(gamma):
        x, y, m = logits[:, j], targets[:, j], mask[:, j]
        at_one = at_one * torch.sigmoid(x)
        before.append(torch_ece(at_one[m], y[m], num_bins))
        best_t = float(grid[0])
        best_s = fitted * torch.sigmoid(x / best_t)
        best_e = torch_ece(best_s[m], y[m], num_bins)
        for t in [float(v) for v in grid[1:]]:
            cand = fitted * torch.sigmoid(x / t)
            e = torch_ece(cand[m], y[m], num_bins)
            if e < best_e:
                best_t, best_s, best_e = t, cand, e
        temps.append(best_t)
        after.append(best_e)
        fitted = best_s
    return temps, before, after


def synthetic_head(rng, n, gamma):
    """True confidences, prefix labels drawn from them, and an overconfident noisy raw logit."""
    z = rng.normal(np.linspace(1.8, 0.6, gamma), 1.0, size=(n, gamma))
    true_conf = 1.0 / (1.0 + np.exp(-z))
    accepted_each = rng.random((n, gamma)) < true_conf
    labels = np.cumprod(accepted_each, axis=1).astype(bool)  # P = running product
    raw = 2.5 * z + rng.normal(0.0, 0.3, size=(n, gamma))
    return raw, labels


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# ---------------------------------------------------------------- labels


def test_labels_hand_computed():
    gamma = 5
    #            static  cap    compact<w  compact full  compact w=gamma  compact w=0
    accepted = [2, 2, 1, 3, 5, 0]
    window = [5, 2, 3, 3, 5, 0]
    ceiling = [2, 4, -1, -1, -1, -1]
    labels, labelled = prefix_labels(accepted, window, ceiling, gamma)
    t, f = True, False
    assert labels.tolist() == [
        [t, t, f, f, f],
        [t, t, t, t, f],
        [t, f, f, f, f],
        [t, t, t, f, f],
        [t, t, t, t, t],
        [f, f, f, f, f],
    ]
    assert labelled.tolist() == [
        [t, t, t, t, t],
        [t, t, t, t, t],
        [t, t, t, t, t],
        [t, t, t, f, f],  # fully accepted window: beyond it is unknown, not a failure
        [t, t, t, t, t],
        [f, f, f, f, f],
    ]
    assert labels.dtype == np.bool_ and labelled.dtype == np.bool_


@pytest.mark.parametrize(
    ("accepted", "window", "ceiling", "gamma"),
    [
        ([3], [2], [-1], 4),  # accepted > window
        ([1], [5], [-1], 4),  # window > gamma
        ([1], [2], [-2], 4),  # ceiling below the sentinel
        ([1], [2], [5], 4),  # ceiling > gamma
        ([1, 2], [2], [-1], 4),  # length mismatch
    ],
)
def test_labels_reject_inconsistent_rows(accepted, window, ceiling, gamma):
    with pytest.raises(ValueError):
        prefix_labels(accepted, window, ceiling, gamma)


@st.composite
def label_rows(draw):
    gamma = draw(st.integers(1, 8))
    n = draw(st.integers(0, 20))
    rows = []
    for _ in range(n):
        w = draw(st.integers(0, gamma))
        a = draw(st.integers(0, w))
        c = draw(st.one_of(st.just(-1), st.integers(0, gamma)))
        rows.append((a, w, c))
    cols = list(zip(*rows, strict=True)) if rows else [(), (), ()]
    return [np.array(c, dtype=np.int64) for c in cols], gamma


@given(label_rows())
def test_labels_match_row_loop(data):
    (accepted, window, ceiling), gamma = data
    labels, labelled = prefix_labels(accepted, window, ceiling, gamma)
    ref_labels, ref_labelled = loop_labels(accepted, window, ceiling, gamma)
    np.testing.assert_array_equal(labels, ref_labels)
    np.testing.assert_array_equal(labelled, ref_labelled)
    # a prefix label never recovers, and labelled positions form a prefix
    assert (np.diff(labels.astype(int), axis=1) <= 0).all()
    assert (np.diff(labelled.astype(int), axis=1) <= 0).all()


# ---------------------------------------------------------------- metrics


def test_ece_matches_loop_and_edge_values():
    rng = np.random.default_rng(0)
    pred = np.concatenate([rng.random(300), [0.0, 1.0, 1 / 15, 14 / 15, -0.3, 1.7]])
    labels = rng.random(pred.size) < np.clip(pred, 0, 1) ** 2
    assert expected_calibration_error(pred, labels) == pytest.approx(loop_ece(pred, labels), 1e-12)
    assert expected_calibration_error(pred, labels, 7) == pytest.approx(
        loop_ece(pred, labels, 7), 1e-12
    )
    assert math.isnan(expected_calibration_error(np.array([]), np.array([])))


@given(
    hnp.arrays(np.float64, st.integers(1, 40), elements=st.floats(0, 1)),
    st.integers(1, 20),
    st.randoms(use_true_random=False),
)
def test_ece_property_matches_loop(pred, num_bins, rnd):
    labels = np.array([rnd.random() < 0.5 for _ in range(pred.size)])
    got = expected_calibration_error(pred, labels, num_bins)
    assert got == pytest.approx(loop_ece(pred, labels, num_bins), rel=1e-12, abs=1e-15)
    assert 0.0 <= got <= 1.0


def test_brier_matches_mean_squared_error():
    pred = np.array([0.1, 0.9, 0.5, 0.0, 1.0])
    labels = np.array([0, 1, 1, 0, 1])
    pairs = zip(pred, labels, strict=True)
    expected = sum((min(max(p, 1e-8), 1 - 1e-8) - y) ** 2 for p, y in pairs)
    assert brier_score(pred, labels) == pytest.approx(expected / 5, rel=1e-14)


def test_auroc_exact_when_scores_fill_distinct_bins():
    rng = np.random.default_rng(1)
    bins = rng.choice(1024, size=400, replace=False)
    pred = (bins + 0.5) / 1024
    labels = rng.random(400) < pred
    assert abs(histogram_auroc(pred, labels) - mann_whitney_auroc(pred, labels)) < 1e-9


def test_auroc_ties_inside_a_bin_count_half():
    rng = np.random.default_rng(2)
    pred = (rng.choice([3, 100, 512, 900, 1023], size=500) + 0.5) / 1024  # heavy ties
    labels = rng.random(500) < pred
    assert abs(histogram_auroc(pred, labels) - mann_whitney_auroc(pred, labels)) < 1e-9


def test_auroc_within_histogram_resolution_on_continuous_scores():
    rng = np.random.default_rng(3)
    pred = rng.beta(2, 2, size=5000)
    labels = rng.random(5000) < pred
    pos_hist = np.histogram(pred[labels], bins=1024, range=(0, 1))[0].astype(float)
    neg_hist = np.histogram(pred[~labels], bins=1024, range=(0, 1))[0].astype(float)
    bound = 0.5 * (pos_hist * neg_hist).sum() / (labels.sum() * (~labels).sum())
    diff = abs(histogram_auroc(pred, labels) - mann_whitney_auroc(pred, labels))
    assert diff <= bound + 1e-12
    assert bound < 1e-3


def test_auroc_nan_with_one_class():
    assert math.isnan(histogram_auroc(np.array([0.2, 0.7]), np.array([1, 1])))
    assert math.isnan(histogram_auroc(np.array([0.2, 0.7]), np.array([0, 0])))


def _random_block(rng, n, gamma):
    pred = np.cumprod(rng.beta(5, 1.5, size=(n, gamma)), axis=1)
    labels = rng.random((n, gamma)) < pred
    labelled = rng.random((n, gamma)) < 0.8
    return pred, labels, labelled


def test_accumulator_matches_direct_metrics_per_position():
    rng = np.random.default_rng(4)
    pred, labels, labelled = _random_block(rng, 2000, 6)
    rows = CalibrationAccumulator(6).update(pred, labels, labelled).compute()
    for j, row in enumerate(rows):
        m = labelled[:, j]
        p, y = pred[m, j], labels[m, j]
        assert row["position"] == j
        assert row["count"] == m.sum()
        # same bins, same order of summation: bit-identical to the direct formula
        assert row["ece"] == expected_calibration_error(p, y)
        assert row["ece"] == pytest.approx(loop_ece(p, y), rel=1e-12)
        assert row["brier"] == pytest.approx(brier_score(p, y), rel=1e-12)
        assert row["auroc"] == histogram_auroc(p, y)
        assert row["pred_mean"] == pytest.approx(np.clip(p, 1e-8, 1 - 1e-8).mean(), rel=1e-12)
        assert row["target_mean"] == pytest.approx(y.mean(), rel=1e-15)
    assert rows == position_metrics(pred, labels, labelled)


def test_accumulator_reliability_bins():
    pred = np.array([[0.05], [0.06], [0.5], [0.99], [0.98]])
    labels = np.array([[0], [1], [1], [1], [0]])
    (rel,) = CalibrationAccumulator(1, num_bins=10).update(pred, labels).reliability()
    assert rel["count"].tolist() == [2, 0, 0, 0, 0, 1, 0, 0, 0, 2]
    assert rel["pred_mean"][0] == pytest.approx(0.055)
    assert rel["target_mean"][0] == pytest.approx(0.5)
    assert rel["pred_mean"][9] == pytest.approx(0.985)
    assert math.isnan(rel["pred_mean"][1]) and math.isnan(rel["target_mean"][1])
    assert rel["lo"][5] == pytest.approx(0.5) and rel["hi"][5] == pytest.approx(0.6)


def test_accumulator_empty_position_is_nan():
    acc = CalibrationAccumulator(2).update(np.full((3, 2), 0.5), np.ones((3, 2)), [[1, 0]] * 3)
    row = acc.compute()[1]
    assert row["count"] == 0
    assert all(math.isnan(row[k]) for k in ("ece", "brier", "auroc", "pred_mean", "target_mean"))


def test_accumulator_rejects_bad_input():
    acc = CalibrationAccumulator(3)
    with pytest.raises(ValueError):
        acc.update(np.zeros((2, 4)), np.zeros((2, 4)))
    with pytest.raises(ValueError):
        acc.update(np.zeros((2, 3)), np.full((2, 3), 2))
    with pytest.raises(ValueError):
        acc.update(np.full((2, 3), np.nan), np.zeros((2, 3)))
    with pytest.raises(ValueError):
        acc.merge(CalibrationAccumulator(4))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 300), st.integers(1, 6), st.data())
def test_accumulator_split_and_merge_invariance(seed, n, gamma, data):
    pred, labels, labelled = _random_block(np.random.default_rng(seed), n, gamma)
    k = data.draw(st.integers(0, n))
    whole = CalibrationAccumulator(gamma).update(pred, labels, labelled)
    chunked = CalibrationAccumulator(gamma)
    chunked.update(pred[:k], labels[:k], labelled[:k]).update(pred[k:], labels[k:], labelled[k:])
    merged = CalibrationAccumulator(gamma).update(pred[:k], labels[:k], labelled[:k])
    merged.merge(CalibrationAccumulator(gamma).update(pred[k:], labels[k:], labelled[k:]))
    for other in (chunked, merged):
        np.testing.assert_array_equal(other.count, whole.count)
        np.testing.assert_array_equal(other.target_sum, whole.target_sum)
        np.testing.assert_array_equal(other.fine_pos, whole.fine_pos)
        for a, b in zip(other.compute(), whole.compute(), strict=True):
            assert a["count"] == b["count"]
            assert a["auroc"] == b["auroc"] or (math.isnan(a["auroc"]) and math.isnan(b["auroc"]))
            for key in ("ece", "brier", "pred_mean", "target_mean"):
                assert a[key] == pytest.approx(b[key], rel=1e-12, abs=1e-15, nan_ok=True)
            assert 0.0 <= b["ece"] <= 1.0 or math.isnan(b["ece"])


# ---------------------------------------------------------------- STS


def test_sts_matches_sglang_torch_loop():
    rng = np.random.default_rng(5)
    logits, labels = synthetic_head(rng, 3000, 5)
    cal = fit_sts(logits, labels, dataset="synthetic")
    temps, before, after = torch_sts(logits, labels, np.ones_like(labels), TEMPERATURE_GRID)
    assert cal.temperatures == temps
    np.testing.assert_allclose(cal.ece_before, before, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(cal.ece_after, after, rtol=1e-12, atol=1e-15)
    assert cal.num_samples == 3000 and cal.dataset == "synthetic"


def test_sts_masked_fit_matches_torch_loop_on_compact_labels():
    rng = np.random.default_rng(6)
    gamma = 6
    logits, full_labels = synthetic_head(rng, 3000, gamma)
    ceiling = full_labels.sum(axis=1)
    window = rng.integers(0, gamma + 1, size=3000)
    accepted = np.minimum(ceiling, window)
    labels, labelled = prefix_labels(accepted, window, np.full(3000, -1), gamma)
    assert not labelled.all()
    cal = fit_sts(logits, labels, labelled)
    temps, before, after = torch_sts(logits, labels, labelled, TEMPERATURE_GRID)
    assert cal.temperatures == temps
    np.testing.assert_allclose(cal.ece_before, before, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(cal.ece_after, after, rtol=1e-12, atol=1e-15)


def test_sts_lowers_ece_on_held_out_data():
    rng = np.random.default_rng(7)
    gamma = 5
    train_logits, train_labels = synthetic_head(rng, 20_000, gamma)
    test_logits, test_labels = synthetic_head(rng, 20_000, gamma)
    cal = fit_sts(train_logits, train_labels)
    raw_survival = np.cumprod(sigmoid(test_logits), axis=1)
    _, fitted_survival = apply_sts(test_logits, cal.temperatures)
    for j in range(gamma):
        before = loop_ece(raw_survival[:, j], test_labels[:, j])
        after = loop_ece(fitted_survival[:, j], test_labels[:, j])
        assert after < 0.5 * before, (j, before, after)
    # the head's logits are 2.5x too sharp at the first position
    assert 1.5 < cal.temperatures[0] < 4.0


def test_sts_ties_keep_smallest_temperature():
    logits = np.zeros((10, 2))  # sigmoid(0 / T) = 0.5 for every T
    labels = np.array([[1, 0]] * 5 + [[0, 0]] * 5)
    cal = fit_sts(logits, labels)
    assert cal.temperatures == [0.1, 0.1]


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 200), st.integers(1, 4))
def test_sts_properties(seed, n, gamma):
    rng = np.random.default_rng(seed)
    logits, labels = synthetic_head(rng, n, gamma)
    cal = fit_sts(logits, labels)
    assert set(cal.temperatures) <= set(TEMPERATURE_GRID.tolist())
    # T = 1 is on the grid, and position 0 has no fitted history yet
    assert cal.ece_after[0] <= cal.ece_before[0]
    # the stored ece_after is the ECE of the survival apply_sts reproduces
    _, survival = apply_sts(logits, cal.temperatures)
    for j in range(gamma):
        assert cal.ece_after[j] == pytest.approx(
            expected_calibration_error(survival[:, j], labels[:, j]), rel=1e-12, abs=1e-15
        )


def test_ece_rows_scores_each_row_like_the_direct_formula():
    rng = np.random.default_rng(8)
    probs, targets = rng.random((41, 200)), rng.random(200) < 0.5
    got = ece_rows(probs, targets)
    for k in range(41):
        assert got[k] == expected_calibration_error(probs[k], targets)


def test_fit_sts_rejects_unfittable_input():
    with pytest.raises(ValueError, match="no labelled rows"):
        fit_sts(np.zeros((3, 2)), np.ones((3, 2)), [[1, 0]] * 3)
    with pytest.raises(ValueError):
        fit_sts(np.zeros((0, 2)), np.zeros((0, 2)))
    with pytest.raises(ValueError):
        fit_sts(np.zeros((3, 2)), np.zeros((3, 3)))


def test_apply_sts_is_sigmoid_over_temperature_and_its_product():
    logits = np.array([[2.0, -1.0, 0.5], [0.0, 3.0, -800.0]])
    temps = [2.0, 0.5, 1.0]
    conf, surv = apply_sts(logits, temps)
    for i in range(2):
        running = 1.0
        for j in range(3):
            c = 1.0 / (1.0 + math.exp(min(-logits[i, j] / temps[j], 700.0)))
            running *= c
            assert conf[i, j] == pytest.approx(c, rel=1e-14, abs=1e-300)
            assert surv[i, j] == pytest.approx(running, rel=1e-14, abs=1e-300)
    with pytest.raises(ValueError):
        apply_sts(logits, [1.0, 1.0])
    with pytest.raises(ValueError):
        apply_sts(logits, [1.0, 0.0, 1.0])


# ---------------------------------------------------------------- STS JSON


def test_sts_json_round_trip(tmp_path):
    rng = np.random.default_rng(9)
    logits, labels = synthetic_head(rng, 500, 4)
    cal = fit_sts(logits, labels, dataset="shards/*.pt")
    path = tmp_path / "sts.json"
    save_sts(cal, path)
    assert load_sts(path) == cal
    raw = json.loads(path.read_text())
    assert list(raw) == ["temperatures", "dataset", "num_samples", "ece_before", "ece_after"]
    assert raw["num_samples"] == 500


def test_sts_reads_sglang_file_and_omits_defaults(tmp_path):
    path = tmp_path / "sglang.json"
    path.write_text(
        '{"temperatures": [0.10000000149011612, 2.5118863582611084], "dataset": "",'
        ' "num_samples": 12, "ece_before": [0.2, 0.3], "ece_after": [0.01, 0.02]}'
    )
    cal = load_sts(path)
    assert cal.temperatures == [0.10000000149011612, 2.5118863582611084]
    assert cal.num_samples == 12 and cal.ece_after == [0.01, 0.02]
    save_sts(StsCalibration(temperatures=[1.0, 2.0]), path)
    assert json.loads(path.read_text()) == {"temperatures": [1.0, 2.0]}


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '{"temperatures": []}',
        '{"temperatures": [1.0, 0.0]}',
        '{"temperatures": [1.0, -2.0]}',
        '{"temperatures": [1e999]}',
        '{"temperatures": ["1.0"]}',
        '{"dataset": "x"}',
        '{"temperatures": [1.0], "num_samples": -1}',
        '{"temperatures": [1.0, 2.0], "ece_before": [0.1]}',
    ],
)
def test_load_sts_rejects_bad_files_naming_the_path(tmp_path, text):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_sts(path)


def test_load_sts_missing_file(tmp_path):
    path = tmp_path / "nope.json"
    with pytest.raises(ValueError, match=re.escape(str(path))):
        load_sts(path)


def test_sts_struct_validates_on_construction():
    with pytest.raises(ValueError):
        StsCalibration(temperatures=[])
    with pytest.raises(ValueError):
        StsCalibration(temperatures=[float("nan")])
    with pytest.raises(ValueError):
        StsCalibration(temperatures=[float("inf")])


def test_package_does_not_import_torch():
    code = "import sys, dspark_obs.calibration; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
