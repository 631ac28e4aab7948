"""The in-band extrapolation's held-out check, identification and point range.

On the reference runtime (a cap-accept shadow gives every request-step's true ceiling)
the check must pass and its bookkeeping is recomputed here from the run's own Parquet;
on a population model that has seen too few blocks, every cell must be flagged and the
point's range must run to the lo/hi bracket (hand arithmetic).
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from dspark_obs.estimator.ceiling_estimator import CeilingEstimator
from dspark_obs.estimator.confidence_rates import ConfidenceRates
from dspark_obs.estimator.extrapolation_check import (
    CHECK_EVERY,
    CheckedExtrapolation,
    ExtrapolationCheck,
    any_per_row,
    checked_steps,
)
from dspark_obs.estimator.interval import block_interval, extrapolated_parts, point_range
from dspark_obs.estimator.population import HazardModel

from dspark_obs.store import open_run
from dspark_obs.store.layout import in_memory

from .conftest import cli


@pytest.fixture(scope="module")
def estimate(compact_run) -> tuple[dict, pl.DataFrame, pl.DataFrame, int]:
    run, _ = compact_run
    report = json.loads(cli("estimate", str(run), "--json").stdout)
    req = in_memory(pl.read_parquet(run / "requests" / "*.parquet"))
    ceilings = pl.read_parquet(run / "ceilings" / "*.parquet")
    return report, req, ceilings, report["gamma"]


def test_the_check_passes_on_the_reference_runtime(estimate):
    report, req, _, gamma = estimate
    for name, e in report["workloads"].items():
        check = e["extrapolation_check"]
        assert check["calibrated"] is True, (name, check)
        assert check["ece"] < 0.03, name
        # every known position of the checked steps is checked once: verified drafts of
        # sampled rows with both log-probabilities, counted here from the stored matrices
        part = req.filter((pl.col("workload") == name) & ~pl.col("greedy"))
        part = part.filter(checked_steps(part["forward_ct"].to_numpy()))
        p = part["target_logprobs"].to_numpy().reshape(-1, gamma)
        q = part["draft_logprobs"].to_numpy().reshape(-1, gamma)
        w = (part["verify_len"] - 1).to_numpy()
        known = (np.arange(gamma)[None, :] < w[:, None]) & ~np.isnan(p) & ~np.isnan(q)
        a = np.minimum(1.0, np.exp(p - q))[known]
        other = check["unidentified_cells"]
        assert check["held_out"] + other["held_out"] == known.sum() > 0, name
        mean = (
            check["mean_observed"] * check["held_out"]
            + other.get("mean_observed", 0.0) * other["held_out"]
        ) / known.sum()
        assert mean == pytest.approx(a.mean(), rel=1e-9), name
        assert sum(b["count"] for b in check["bins"]) == check["held_out"]


def test_the_point_range_brackets_the_point_and_the_report_averages_it(estimate):
    report, _, ceilings, _ = estimate
    c = {k: ceilings[k].to_numpy() for k in ("lo", "point", "hi", "point_lo", "point_hi")}
    unident = ceilings["unidentified"].to_numpy()
    tol = 1e-12
    assert (c["lo"] <= c["point_lo"] + tol).all() and (c["point_lo"] <= c["point"] + tol).all()
    assert (c["point"] <= c["point_hi"] + tol).all() and (c["point_hi"] <= c["hi"] + tol).all()
    assert ((unident >= 0) & (unident <= c["point"] - c["lo"] + tol)).all()
    greedy = ceilings.filter(pl.col("method") == "greedy")
    assert (greedy["unidentified"] == 0).all()
    assert (greedy["point_lo"] == greedy["point"]).all()
    for name, e in report["workloads"].items():
        part = ceilings.filter((pl.col("workload") == name) & (pl.col("method") == "sampled"))
        s = e["sampled"]
        assert s["unidentified"] == pytest.approx(part["unidentified"].mean(), rel=1e-12)
        want = [part["point_lo"].mean(), part["point_hi"].mean()]
        assert s["point_range"] == pytest.approx(want, rel=1e-12)


def test_the_point_is_the_population_models_where_there_is_no_smooth_rate(compact_run):
    """Replayed with the population model's bare `expected_extra` as the extrapolation, the
    run's walks give the same points as the checked extrapolation without a smooth rate:
    the blend is the only thing the check changes about the point."""
    run = open_run(compact_run[0])
    gamma = int(run.manifest["gamma"])
    points = []
    for bare in (False, True):
        est = CeilingEstimator(gamma)
        if bare:
            est.extrapolation = est.population.expected_extra
        else:
            est.check.smooth.rates_at = lambda groups, pos, conf: np.full(np.shape(conf), np.nan)
        for batch in run.batches():
            est.update(batch)
        est.close()
        points.append(est.take_rows())
    checked, bare = points
    assert checked.height == bare.height > 0
    np.testing.assert_allclose(checked["point"], bare["point"], rtol=1e-9, atol=1e-12)
    assert "unidentified" in checked.columns
    # a bare extrapolation was checked by nothing: all of it counts as unidentified
    np.testing.assert_allclose(
        bare["unidentified"], bare["point"] - bare["lo"], rtol=1e-9, atol=1e-12
    )
    assert (checked["unidentified"] <= bare["unidentified"] + 1e-12).all()


def test_the_smooth_model_recovers_a_law_in_position_and_confidence():
    """Known ratios that follow a logistic law in position and the confidence's logit, at
    positions 0-3 only: the fit carries the law to positions 4-6, which it never saw."""
    gamma, n = 7, 4000
    rng = np.random.default_rng(3)
    conf = rng.uniform(0.02, 0.98, (n, gamma))
    logit = np.log(conf) - np.log1p(-conf)
    a = 1 / (1 + np.exp(-(0.4 - 0.25 * np.arange(gamma) + 0.8 * logit)))
    known = np.arange(gamma)[None, :] < 4
    model = ConfidenceRates(gamma)
    model.update(np.zeros(n, np.int64), np.broadcast_to(known, (n, gamma)), a, conf)
    got = model.rates(np.zeros(n, np.int64), conf)
    # each known position stands at its confidence bin's centre: a small smoothing error
    assert np.abs(got - a).max() < 0.02
    assert np.abs((got - a)[:, 4:]).mean() < 0.005
    assert np.isnan(model.rates(np.zeros(1, np.int64), np.full((1, gamma), np.nan))).all()
    assert model.fitted(np.array([0, 1])).tolist() == [True, False]


def test_unidentified_cells_take_the_blend_the_held_out_positions_chose():
    """A head whose confidence is twice the acceptance: the population model's fallback in
    its unidentified cells says c, the known positions there say c / 2, which the smooth
    model learns; held out, the blend with all weight on it missed least, so those cells
    take it, while the identified cell keeps the population model's rate."""
    gamma, n = 4, 400
    model, check = _thin_model(gamma), ExtrapolationCheck(gamma)
    rng = np.random.default_rng(5)
    window, greedy = np.full(n, gamma), np.zeros(n, np.int8)
    for _ in range(3):  # the first batch teaches the smooth model; later ones check it
        conf = rng.uniform(0.05, 0.9, (n, gamma))
        p, q = np.log(conf / 2), np.zeros((n, gamma))
        check.observe(model, np.zeros(n, np.int64), window, greedy, conf, p, q, _CHECKED)
    np.testing.assert_allclose(check.blend_weight(np.array([0, 1])), [1.0, 0.0], atol=0.05)
    conf = np.array([[0.95, 0.6, 0.3, 0.5]])
    assert check.smooth.supported(np.zeros(1, np.int64), conf)[0, 1:].all()
    rates, identified = check.rates(model, np.zeros(1, np.int64), conf)
    assert identified[0].tolist() == [True, False, False, False]
    assert rates[0, 0] == 1.0  # the population model's, from data
    np.testing.assert_allclose(rates[0, 1:], conf[0, 1:] / 2, atol=0.02)
    extra = CheckedExtrapolation(model, check)(np.zeros(1, np.int64), np.array([1]), conf)
    r = rates[0]
    assert extra[0] == pytest.approx(r[1] + r[1] * r[2] + r[1] * r[2] * r[3], rel=1e-12)
    # a confidence no known position came near: the smooth model extrapolates as much as
    # the fallback does, and the point takes the middle of the two
    far = np.array([[0.95, 0.99, 0.99, 0.99]])
    assert not check.smooth.supported(np.zeros(1, np.int64), far)[0, 1:].any()
    fallback, _, _ = model.rates(np.zeros(1, np.int64), far)
    smooth = check.smooth.rates(np.zeros(1, np.int64), far)
    got, _ = check.rates(model, np.zeros(1, np.int64), far)
    np.testing.assert_allclose(got[0, 1:], (fallback + smooth)[0, 1:] / 2, rtol=1e-12)


#: The first step whose rows are checked.
_CHECKED = int(np.flatnonzero(checked_steps(np.arange(64)))[0])


def test_one_step_in_check_every_is_checked_and_every_step_teaches_the_smooth_model():
    """The check samples whole steps by a hash of forward_ct: about one in `CHECK_EVERY`
    of any run of steps, and of every residue of a power-of-two period (slot-like counters
    would keep one phase); rows of other steps are not checked, but the smooth model learns
    them all (its cells count every known position)."""
    fct = np.arange(1 << 16)
    picked = checked_steps(fct)
    assert picked.mean() == pytest.approx(1 / CHECK_EVERY, rel=0.02)
    for period in (4, 64, 256):
        share = np.bincount(fct % period, picked, period) / np.bincount(fct % period)
        assert np.abs(share - 1 / CHECK_EVERY).max() < 0.04, period
    gamma, n = 3, 100
    model, check = _thin_model(gamma), ExtrapolationCheck(gamma)
    conf = np.full((n, gamma), 0.8)
    p, q = np.full((n, gamma), np.log(0.4)), np.zeros((n, gamma))
    window, greedy = np.full(n, gamma), np.zeros(n, np.int8)
    skipped = int(np.flatnonzero(~picked)[0])
    steps = np.where(np.arange(n) < 30, _CHECKED, skipped)  # 30 rows checked, 70 not
    check.observe(model, np.zeros(n, np.int64), window, greedy, conf, p, q, steps)
    report = check.calibration(0)
    assert report["held_out"] + report["unidentified_cells"]["held_out"] == 30 * gamma
    assert check.smooth._sums[0, 0].sum() == n * gamma


def _thin_model(gamma: int) -> HazardModel:
    """A model that has seen 40 blocks of one group, all windows 1 and accepted: only
    position 0's confidence bin 9 is identified (hazard 0)."""
    model = HazardModel(gamma)
    conf = np.full((40, gamma), 0.95)
    model.update(np.zeros(40, np.int64), np.ones(40), np.ones(40), conf)
    return model


def test_too_few_known_positions_are_flagged_and_widened_to_the_bracket():
    gamma = 4
    model, check = _thin_model(gamma), ExtrapolationCheck(gamma)
    extrapolation = CheckedExtrapolation(model, check)
    rates, ident, _ = model.rates(np.zeros(1, np.int64), np.full((1, gamma), 0.95))
    assert ident[0].tolist() == [True, False, False, False]
    assert rates[0, 0] == 1.0
    start = np.array([1, 2])  # nothing past position 0 is identified
    conf = np.full((2, gamma), 0.95)
    unreached = gamma - start
    extra, lo, hi, unident = extrapolated_parts(
        extrapolation, np.zeros(2, np.int64), start, conf, unreached
    )
    # unidentified cells use the calibration fallback: rate 0.95 per position
    want = [0.95 + 0.95**2 + 0.95**3, 0.95 + 0.95**2]
    np.testing.assert_allclose(extra, want, rtol=1e-12)
    np.testing.assert_allclose(extra, model.expected_extra(np.zeros(2), start, conf))
    np.testing.assert_allclose(unident, extra)  # all of it rests on unidentified cells
    np.testing.assert_array_equal(lo, [0.0, 0.0])
    np.testing.assert_array_equal(hi, unreached)  # every rate anywhere in [0, 1]
    # through the block interval: the point range is the whole bracket
    cum = np.array([0.5, 0.8])
    iv = block_interval(np.array([1, 2]), np.zeros(2), np.zeros(2), cum, unreached, extra)
    iv.update(point_range(iv["lo"], cum, unreached, lo, hi, unident))
    np.testing.assert_array_equal(iv["point_lo"], iv["lo"])
    np.testing.assert_array_equal(iv["point_hi"], iv["hi"])
    np.testing.assert_allclose(iv["unidentified"], iv["point"] - iv["lo"])


def test_identified_cells_range_within_the_checked_margin():
    gamma = 2
    model, check = _thin_model(gamma), ExtrapolationCheck(gamma)
    # known positions checked before the model learns them: ratio 0.9 at position 0,
    # where the model says 1.0: an ECE of 0.1
    n = 50
    window, greedy = np.ones(n, np.int64), np.zeros(n, np.int8)
    conf = np.full((n, gamma), 0.95)
    p = np.full((n, gamma), np.log(0.45))
    q = np.full((n, gamma), np.log(0.5))
    check.observe(model, np.zeros(n, np.int64), window, greedy, conf, p, q, _CHECKED)
    report = check.calibration(0)
    assert report["held_out"] == n and report["unidentified_cells"]["held_out"] == 0
    assert report["ece"] == pytest.approx(0.1, rel=1e-12)
    assert report["calibrated"] is False  # 0.1 > 0.02 + 3 se (no spread, se = 0)
    assert check.margin(np.array([0, 1])).tolist() == pytest.approx([0.1, 1.0])
    got = CheckedExtrapolation(model, check).parts(np.zeros(1), np.zeros(1, np.int64), conf[:1])
    # position 0 identified (rate 1 +- 0.1), position 1 not (anywhere): there the smooth
    # model, fitted on position 0 alone (every ratio 0.9, one confidence: its intercept),
    # has no known position near, so the rate is the middle of the fallback 0.95 and 0.9
    # (up to the fit's faint ridge)
    np.testing.assert_allclose(got[:, 0], [1 + 0.925, 0.9, 2.0, 0.925], rtol=1e-4)


def test_known_ratios_against_a_per_position_loop():
    from dspark_obs.estimator.extrapolation_check import known_ratios

    rng = np.random.default_rng(5)
    n, gamma = 40, 5
    window = rng.integers(0, gamma + 1, n)
    greedy = rng.integers(0, 2, n)
    target = np.log(rng.uniform(size=(n, gamma)))
    draft = np.log(rng.uniform(size=(n, gamma)))
    target[rng.uniform(size=(n, gamma)) < 0.1] = np.nan
    target[0, 0] = -np.inf
    known, a = known_ratios(window, greedy, target, draft, gamma)
    for i in range(n):
        for j in range(gamma):
            want = j < window[i] and greedy[i] == 0 and not np.isnan(target[i, j])
            assert known[i, j] == want
            if want:
                assert a[i, j] == pytest.approx(min(1.0, np.exp(target[i, j] - draft[i, j])))


def test_any_per_row_is_numpys_any_along_rows():
    rng = np.random.default_rng(11)
    for n, gamma in ((0, 5), (1, 1), (37, 7), (200, 12)):
        mask = rng.uniform(size=(n, gamma)) < 0.1
        got = any_per_row(mask)
        np.testing.assert_array_equal(got, mask.any(axis=1))
        assert got.dtype == bool and not np.shares_memory(got, mask)


def _replay_args(run):
    parts = run.scan_parts("requests")
    df = run.requests().collect()
    names = sorted(df["workload"].unique().to_list(), key=lambda w: (w is None, w))
    largest = int(df["workload"].value_counts()["count"].max())
    return parts, df, names, largest


def test_the_post_hoc_replay_reads_the_run_in_windows_of_whole_batches(compact_run, monkeypatch):
    """`evaluate` replays the check over chunks of about REPLAY_CHUNK_ROWS request-steps
    (a 10M-row run held its three gamma-wide columns at once before); windows of 100 rows,
    calls of 3 batches or of 20 rows, and parts whose steps come out of order (several
    ranks, in one part or in parts of their own), give what one window gives."""
    from dspark_obs.estimator import evaluate as evaluate_module

    run = open_run(compact_run[0])
    parts, df, names, largest = _replay_args(run)
    monkeypatch.setattr(evaluate_module, "REPLAY_CHUNK_ROWS", 10**12)
    whole = evaluate_module.population_replay(parts, names, run.gamma, largest)
    monkeypatch.setattr(evaluate_module, "REPLAY_CHUNK_ROWS", 100)
    monkeypatch.setattr(evaluate_module, "REPLAY_BATCHES", 3)
    assert len(evaluate_module._step_chunks(parts)[1]) >= 3
    assert evaluate_module.population_replay(parts, names, run.gamma, largest) == whole
    monkeypatch.setattr(evaluate_module, "REPLAY_ROWS", 20)  # a call a batch, most often
    assert evaluate_module.population_replay(parts, names, run.gamma, largest) == whole
    # the later half of the steps first, each step's rows kept together and in order
    fct = df["forward_ct"].to_numpy()
    cut = int(np.searchsorted(fct, fct[len(fct) // 2], side="left"))
    swapped = [pl.concat([df[cut:], df[:cut]]).lazy()]
    assert evaluate_module.population_replay(swapped, names, run.gamma, largest) == whole
    halves = [df[cut:].lazy(), df[:0].lazy(), df[:cut].lazy()]  # and an empty part
    assert evaluate_module.population_replay(halves, names, run.gamma, largest) == whole


def test_the_replay_is_the_in_band_estimators_batch_by_batch(compact_run, monkeypatch):
    """The replay learns and checks many batches a call; the in-band estimator calls
    `observe` then `update` once a batch. Done here that way, over the run's batches (of 2
    steps, so that there are many, and the smooth model is refitted between them), the
    check and the population estimates over every block are the replay's to the last bit
    (and the estimates are those of one fit on all the rows, within rounding)."""
    from dspark_obs.estimator import evaluate as evaluate_module
    from dspark_obs.estimator.population import population_estimates

    steps = 2
    monkeypatch.setattr(evaluate_module, "POPULATION_BATCH_STEPS", steps)
    refits = []
    monkeypatch.setattr(ConfidenceRates, "_refit", _counted(ConfidenceRates._refit, refits))

    run = open_run(compact_run[0])
    parts, df, names, largest = _replay_args(run)
    gamma = run.gamma
    estimates, checks = evaluate_module.population_replay(parts, names, gamma, largest)
    replay_refits, refits[:] = len(refits), []
    df = df.sort("forward_ct", maintain_order=True)
    group = np.array([names.index(w) for w in df["workload"].to_list()])
    cols = {c: df[c].to_numpy() for c in ("window", "correct_drafts", "forward_ct")}
    mats = {c: df[c].to_numpy().reshape(-1, gamma) for c in CONFIDENCE_COLUMNS}
    greedy = df["greedy"].cast(pl.Int8).fill_null(-1).to_numpy()
    model = HazardModel(gamma, reservoir=largest)
    model.ensure_groups(len(names))
    check = ExtrapolationCheck(gamma)
    batch = (cols["forward_ct"] - cols["forward_ct"][0]) // steps
    starts = np.flatnonzero(np.diff(batch, prepend=-1))
    assert len(starts) > 50
    for lo, hi in zip(starts, [*starts[1:], len(batch)], strict=True):
        conf, target, draft = (mats[c][lo:hi] for c in CONFIDENCE_COLUMNS)
        w, a = cols["window"][lo:hi], cols["correct_drafts"][lo:hi]
        check.observe(
            model, group[lo:hi], w, greedy[lo:hi], conf, target, draft, cols["forward_ct"][lo:hi]
        )
        model.update(group[lo:hi], w, a, conf)
    assert replay_refits == len(refits) > 3 * len(names)
    assert checks == [check.calibration(g) for g in range(len(names))]
    assert estimates == model.estimates()
    fitted = population_estimates(
        group, cols["window"], cols["correct_drafts"], mats["confidence"], gamma,
        groups=len(names),
    )  # fmt: skip
    for got, want in zip(estimates, fitted, strict=True):
        for key in ("survival", "naive_km", "mean"):
            np.testing.assert_allclose(got[key], want[key], rtol=1e-12)
        assert got["identifiable"] == want["identifiable"]


CONFIDENCE_COLUMNS = ("confidence", "target_logprobs", "draft_logprobs")


def _counted(method, calls: list):
    def wrapper(self, *args):
        calls.append(args[0])
        return method(self, *args)

    return wrapper


def test_replay_calls_hold_whole_batches_within_both_bounds(monkeypatch):
    from dspark_obs.estimator import evaluate as evaluate_module

    monkeypatch.setattr(evaluate_module, "REPLAY_ROWS", 10)
    monkeypatch.setattr(evaluate_module, "REPLAY_BATCHES", 3)
    batch = np.array([0] * 12 + [1, 2, 2, 3, 4, 5, 5, 5, 9])
    # batch 0 alone (12 rows, over the bound); then 1-3; 4-5; 9
    assert evaluate_module._replay_calls(batch) == [(0, 12), (12, 16), (16, 20), (20, 21)]
    assert evaluate_module._replay_calls(batch[:0]) == []
