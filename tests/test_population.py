"""The stratified hazard model, checked by hand, by property, and against a shadow's truth."""

from __future__ import annotations

import json

import numpy as np
import pytest
from dspark_obs.estimator.population import HazardModel, population_estimate
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.runtime.sts_warmup import warmup_sts

GAMMA = 7
HI, LO = 0.9, 0.2  # with bins=2: bin 1 and bin 0


def _tiny():
    """Four blocks; B2 is trimmed at 3 with low confidence past its window (informative)."""
    window = np.array([3, 3, 7, 2])
    accepted = np.array([1, 3, 7, 0])
    conf = np.full((4, GAMMA), HI)
    conf[1, 3:] = LO
    conf[3, :] = 0.3
    return window, accepted, conf


# By hand, bins=2, min_at_risk=1, rows = positions, columns = (low, high) bin:
# pos 0: high at risk B1 B2 B3, no event -> 0; low at risk B4, rejected -> 1
# pos 1: high at risk B1 B2 B3, B1 rejected -> 1/3; low: B4 not at risk -> 1 - 0.3
# pos 2: high at risk B2 B3 -> 0; low -> 1 - 0.3
# pos 3+: high at risk B3 -> 0; low: B2 (0.2) and B4 (0.3) never verified -> 1 - 0.25
HAND_HAZARDS = np.array(
    [[1.0, 0.0], [0.7, 1 / 3], [0.7, 0.0], [0.75, 0.0], [0.75, 0.0], [0.75, 0.0], [0.75, 0.0]]
)
HAND_FROM_DATA = np.array([[True, True], [False, True], [False, True]] + [[False, True]] * 4)


def _hand_survival():
    b1 = np.array([1, 2 / 3, 2 / 3, 2 / 3, 2 / 3, 2 / 3, 2 / 3])  # B1 and B3: all high
    b2 = np.array([1, 2 / 3, 2 / 3, 2 / 3 / 4, 2 / 3 / 16, 2 / 3 / 64, 2 / 3 / 256])
    b4 = np.zeros(GAMMA)
    return (2 * b1 + b2 + b4) / 4


def test_tiny_case_hazards_by_hand():
    w, a, c = _tiny()
    m = HazardModel(GAMMA, bins=2, min_at_risk=1)
    m.update(0, w, a, c)
    np.testing.assert_allclose(m.hazards(0), HAND_HAZARDS)
    np.testing.assert_array_equal(m.identified(0), HAND_FROM_DATA)


def test_tiny_case_survival_by_hand():
    w, a, c = _tiny()
    m = HazardModel(GAMMA, bins=2, min_at_risk=1)
    m.update(0, w, a, c)
    s, identifiable = m.survival(0)
    np.testing.assert_allclose(s, _hand_survival())
    assert s[0] == 0.75 and s[3] == pytest.approx(0.375)
    # position 1: 3 of B1..B4's cells from data, so the pooled share is 7/8 < 95%
    assert identifiable.tolist() == [True] + [False] * 6
    assert m.expected_ceiling(0) == pytest.approx(_hand_survival().sum())


def test_tiny_case_naive_km_by_hand():
    w, a, c = _tiny()
    # at risk 4, 3, 2, 1, 1, 1, 1; rejected at 0 (B4) and at 1 (B1)
    km = [0.75, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]
    r = population_estimate(w, a, c, GAMMA, bins=2, min_at_risk=1)
    np.testing.assert_allclose(r["naive_km"], km)
    np.testing.assert_allclose(r["survival"], _hand_survival())
    assert r["mean"] == pytest.approx(_hand_survival().sum())
    # KM credits B2 with B3's certain tail; the stratified model does not
    assert r["survival"][3] < r["naive_km"][3]
    # without confidence the model is plain KM
    r0 = population_estimate(w, a, None, GAMMA, bins=2, min_at_risk=1)
    np.testing.assert_allclose(r0["survival"], km)
    np.testing.assert_allclose(r0["naive_km"], km)


def test_tiny_case_km_extrapolation():
    w, a, _ = _tiny()
    # min_at_risk=3: positions 2+ (2 and 1 at risk) carry position 1's hazard 1/3
    m = HazardModel(GAMMA, bins=2, min_at_risk=3)
    m.update(0, w, a, None)
    np.testing.assert_allclose(m.km_hazards(0), [0.25, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3, 1 / 3])
    s, identifiable = m.survival(0)
    np.testing.assert_allclose(s, 0.75 * (2 / 3) ** np.arange(GAMMA))
    assert identifiable.tolist() == [True, True] + [False] * 5
    # min_at_risk=5: nothing identified, so the pooled hazard 2 events / 13 at risk
    m = HazardModel(GAMMA, bins=2, min_at_risk=5)
    m.update(0, w, a, None)
    np.testing.assert_allclose(m.km_hazards(0), np.full(GAMMA, 2 / 13))
    assert not m.survival(0)[1].any()


def test_tiny_case_expected_extra_by_hand():
    w, a, c = _tiny()
    m = HazardModel(GAMMA, bins=2, min_at_risk=1)
    m.update(0, w, a, c)
    high = np.full(GAMMA, HI)
    low_tail = np.where(np.arange(GAMMA) < 3, HI, LO)
    conf = np.stack([high, high, low_tail, high, c[3]])
    extra = m.expected_extra(np.zeros(5, int), np.array([3, 1, 3, 7, 0]), conf)
    np.testing.assert_allclose(extra, [4.0, 6 * 2 / 3, 1 / 4 + 1 / 16 + 1 / 64 + 1 / 256, 0.0, 0.0])
    # no confidence: the pooled KM hazards (min_at_risk=1: 0.25, 1/3, then 0)
    km_extra = m.expected_extra(np.zeros(2, int), np.array([0, 2]), None)
    np.testing.assert_allclose(km_extra, [0.75 + 6 * 0.5, 5.0])


def test_groups_are_independent_and_updates_accumulate():
    w, a, c = _tiny()
    one = HazardModel(GAMMA, bins=2, min_at_risk=1)
    one.update(0, w, a, c)
    split = HazardModel(GAMMA, bins=2, min_at_risk=1)
    for i in range(4):  # block by block, interleaved with another group's blocks
        split.update(np.array([1, 0]), w[[3 - i, i]], a[[3 - i, i]], c[[3 - i, i]])
    np.testing.assert_allclose(split.hazards(0), one.hazards(0))
    np.testing.assert_allclose(split.survival(0)[0], one.survival(0)[0])
    np.testing.assert_allclose(split.hazards(1), one.hazards(0))
    assert split.groups == 2
    with pytest.raises(KeyError):
        split.survival(2)


def test_reservoir_keeps_the_most_recent_blocks():
    w, a, c = _tiny()
    m = HazardModel(GAMMA, bins=2, min_at_risk=1, reservoir=2)
    m.update(0, w[:3], a[:3], c[:3])
    m.update(0, w[3:], a[3:], c[3:])
    # hazards use every block; the average runs over B3 and B4 only
    np.testing.assert_allclose(m.hazards(0), HAND_HAZARDS)
    b3 = np.array([1, 2 / 3, 2 / 3, 2 / 3, 2 / 3, 2 / 3, 2 / 3])
    np.testing.assert_allclose(m.survival(0)[0], b3 / 2)


def test_rejects_impossible_blocks():
    m = HazardModel(GAMMA)
    with pytest.raises(ValueError):
        m.update(0, np.array([3]), np.array([4]), None)
    with pytest.raises(ValueError):
        m.update(0, np.array([8]), np.array([1]), None)
    with pytest.raises(ValueError):
        m.update(0, np.array([3]), np.array([1]), np.full((1, GAMMA), 1.5))
    m.ensure_groups(1)
    s, identifiable = m.survival(0)
    assert np.isnan(s).all() and not identifiable.any()


# -- properties ---------------------------------------------------------------


@st.composite
def _blocks(draw, censored: bool = True):
    gamma = draw(st.integers(1, 8))
    n = draw(st.integers(1, 40))
    if censored:
        w = np.array(draw(st.lists(st.integers(0, gamma), min_size=n, max_size=n)))
    else:
        w = np.full(n, gamma)
    frac = np.array(draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)))
    a = np.floor(frac * (w + 1)).astype(np.int64).clip(0, w)
    cells = draw(st.lists(st.floats(0, 1), min_size=n * gamma, max_size=n * gamma))
    conf = np.array(cells).reshape(n, gamma)
    groups = np.array(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    return gamma, w, a, conf, groups


@settings(max_examples=150, deadline=None)
@given(_blocks(), st.integers(1, 12), st.integers(1, 5), st.booleans())
def test_survival_is_a_non_increasing_probability(blocks, bins, min_at_risk, with_conf):
    gamma, w, a, conf, groups = blocks
    m = HazardModel(gamma, bins=bins, min_at_risk=min_at_risk)
    m.update(groups, w, a, conf if with_conf else None)
    for g in np.unique(groups).tolist():
        s, _ = m.survival(g)
        assert ((s >= 0) & (s <= 1)).all()
        assert (np.diff(s) <= 1e-12).all()
        assert ((m.hazards(g) >= 0) & (m.hazards(g) <= 1)).all()


@settings(max_examples=150, deadline=None)
@given(_blocks(), st.integers(1, 12), st.data())
def test_cell_counts_match_a_per_block_loop(blocks, bins, data):
    """At-risk, event, visit and confidence-sum counts per (group, position, bin), and the
    pooled Kaplan-Meier counts, against the definitions walked block by block; some
    entries without confidence (NaN) go to the pooled stratum only."""
    gamma, w, a, conf, groups = blocks
    missing = np.array(data.draw(st.lists(st.booleans(), min_size=conf.size, max_size=conf.size)))
    conf = np.where(missing.reshape(conf.shape), np.nan, conf)
    m = HazardModel(gamma, bins=bins)
    m.update(groups, w, a, conf)
    shape = (int(groups.max()) + 1, gamma, bins)
    n, d, cnt, csum = np.zeros(shape), np.zeros(shape), np.zeros(shape), np.zeros(shape)
    n0, d0 = np.zeros(shape[:2]), np.zeros(shape[:2])
    for g, wi, ai, ci in zip(groups, w, a, conf, strict=True):
        for j in range(gamma):
            at_risk = j <= ai and j < wi
            n0[g, j] += at_risk
            d0[g, j] += j == ai < wi
            if np.isnan(ci[j]):
                continue
            k = min(int(ci[j] * bins), bins - 1)
            n[g, j, k] += at_risk
            d[g, j, k] += j == ai < wi
            cnt[g, j, k] += 1
            csum[g, j, k] += ci[j]
    np.testing.assert_array_equal(m._n, n)
    np.testing.assert_array_equal(m._d, d)
    np.testing.assert_array_equal(m._ccnt, cnt)
    np.testing.assert_allclose(m._csum, csum, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(m._n0, n0)
    np.testing.assert_array_equal(m._d0, d0)


@settings(max_examples=150, deadline=None)
@given(_blocks(censored=False), st.integers(1, 12), st.booleans())
def test_without_censoring_the_estimate_is_the_empirical_survival(blocks, bins, shared_conf):
    """Every block fully verified: a is the ceiling, and KM (or one shared bin path) is exact."""
    gamma, w, a, conf, _ = blocks
    empirical = [(a > j).mean() for j in range(gamma)]
    # one bin sequence shared by all blocks: stratifying changes nothing
    confidence = np.broadcast_to(conf[:1], conf.shape) if shared_conf else None
    r = population_estimate(w, a, confidence, gamma, bins=bins, min_at_risk=1)
    np.testing.assert_allclose(r["survival"], empirical, atol=1e-12)
    np.testing.assert_allclose(r["naive_km"], empirical, atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(_blocks(), st.integers(1, 12), st.integers(1, 5), st.data())
def test_expected_extra_matches_a_per_block_loop(blocks, bins, min_at_risk, data):
    gamma, w, a, conf, groups = blocks
    m = HazardModel(gamma, bins=bins, min_at_risk=min_at_risk)
    m.update(groups, w, a, conf)
    k = data.draw(st.integers(1, 10))
    g = np.array(data.draw(st.lists(st.integers(0, 3), min_size=k, max_size=k)))
    start = np.array(data.draw(st.lists(st.integers(0, gamma + 2), min_size=k, max_size=k)))
    c = np.array(
        data.draw(
            st.lists(
                st.one_of(st.floats(0, 1), st.just(np.nan)), min_size=k * gamma, max_size=k * gamma
            )
        )
    ).reshape(k, gamma)
    got = m.expected_extra(g, start, c)
    for r in range(k):
        total, keep = 0.0, 1.0
        for i in range(start[r], gamma):
            if np.isnan(c[r, i]):
                h = m.km_hazards(g[r])[i]
            else:
                h = m.hazards(g[r])[i, min(int(c[r, i] * bins), bins - 1)]
            keep *= 1.0 - h
            total += keep
        assert got[r] == pytest.approx(total, abs=1e-12)


# -- acceptance on the runtime --------------------------------------------------


@pytest.fixture(scope="module")
def shadowed_run():
    """A compact run whose cap-accept shadow reveals every block's true ceiling."""
    config = RuntimeConfig(
        mode="compact", shadow="cap-accept", concurrency=[64, 128], steps_per_level=1000, seed=0
    )
    config.sts_temperatures = list(warmup_sts(config, 150).temperatures)
    online = HazardModel(config.gamma)  # default reservoir: the most recent 8192 blocks
    cols = {k: [] for k in ("window", "accepted", "confidence", "ceiling", "group")}
    for b in DSparkRuntime(config).run():
        online.update(b.workload_codes, b.window, b.correct_drafts, b.confidence)
        cols["window"].append(b.window)
        cols["accepted"].append(b.correct_drafts)
        cols["confidence"].append(b.confidence)
        cols["ceiling"].append(b.shadow_ceiling)
        cols["group"].append(b.workload_codes)
    names = tuple(w.name for w in config.workloads)
    return config.gamma, names, {k: np.concatenate(v) for k, v in cols.items()}, online


@pytest.mark.slow
def test_estimate_matches_the_shadow_truth_where_identifiable(shadowed_run, record_property):
    gamma, names, cols, online = shadowed_run
    w, a, c, ceiling, group = (
        cols[k] for k in ("window", "accepted", "confidence", "ceiling", "group")
    )
    assert (ceiling >= 0).all()
    report = {}
    for g, name in enumerate(names):
        m = group == g
        trimmed = int(((a == w) & (w < gamma) & m).sum())
        assert trimmed >= 10_000, (name, trimmed)
        truth = np.array([(ceiling[m] > j).mean() for j in range(gamma)])
        r = population_estimate(w[m], a[m], c[m], gamma)
        est, km = np.array(r["survival"]), np.array(r["naive_km"])
        ident = np.array(r["identifiable"])
        dev, km_dev = np.abs(est - truth), np.abs(km - truth)
        # the online model over its reservoir, against the truth of the same recent blocks
        recent = np.array([(ceiling[m][-online.reservoir :] > j).mean() for j in range(gamma)])
        s_online, ident_online = online.survival(g)
        online_dev = np.abs(s_online - recent)
        report[name] = {
            "blocks": int(m.sum()),
            "trimmed": trimmed,
            "identifiable_positions": int(ident.sum()),
            "max_dev_identifiable": float(dev[ident].max()),
            "max_dev_all": float(dev.max()),
            "dev_by_position": np.round(dev, 4).tolist(),
            "naive_km_max_dev": float(km_dev.max()),
            "online_identifiable_positions": int(ident_online.sum()),
            "online_max_dev_identifiable": float(online_dev[ident_online].max()),
        }
        assert ident[0], name
        assert (dev[ident] <= 0.02).all(), (name, dev, ident)
        assert (online_dev[ident_online] <= 0.02).all(), (name, online_dev, ident_online)
        assert r["mean"] == pytest.approx(ceiling[m].mean(), abs=0.1)
        # ignoring informative censoring over-states deep survival by far more
        assert km_dev.max() > max(0.1, 5 * dev.max()), (name, km_dev, dev)
    print(json.dumps(report, indent=1))
    record_property("population_estimate", json.dumps(report))


@pytest.mark.slow
def test_online_model_with_a_full_reservoir_is_the_offline_estimate(shadowed_run):
    gamma, _, cols, _ = shadowed_run
    m = cols["group"] == 0
    n = int(m.sum())
    model = HazardModel(gamma, reservoir=n)
    for chunk in np.array_split(np.flatnonzero(m), 7):
        model.update(0, cols["window"][chunk], cols["accepted"][chunk], cols["confidence"][chunk])
    r = population_estimate(cols["window"][m], cols["accepted"][m], cols["confidence"][m], gamma)
    s, ident = model.survival(0)
    np.testing.assert_allclose(s, r["survival"], rtol=1e-12)
    assert ident.tolist() == r["identifiable"]
    np.testing.assert_allclose(model.naive_km(0), r["naive_km"], rtol=1e-12)


def test_acceptance_is_rates_without_the_standard_errors():
    rng = np.random.default_rng(4)
    model = HazardModel(5, bins=4, min_at_risk=3)
    w = rng.integers(0, 6, 400)
    a = np.minimum(w, rng.integers(0, 6, 400))
    conf = rng.uniform(size=(400, 5))
    model.update(rng.integers(0, 2, 400), w, a, conf)
    groups, query = rng.integers(0, 2, 50), rng.uniform(size=(50, 5))
    query[3, 2] = np.nan  # the pooled stratum
    rates, ident, _ = model.rates(groups, query)
    got_rates, got_ident = model.acceptance(groups, query)
    np.testing.assert_array_equal(got_rates, rates)
    np.testing.assert_array_equal(got_ident, ident)


def _batched_blocks(seed: int, n: int = 3000, batches: int = 60):
    """Blocks of 3 groups over `batches` batches, some empty, with NaN confidence (the
    pooled stratum) on some rows and positions."""
    rng = np.random.default_rng(seed)
    batch = np.sort(rng.integers(0, batches, n))
    batch[batch == 7] = 8  # an empty batch in the middle
    group = rng.integers(0, 3, n)
    window = rng.integers(0, GAMMA + 1, n)
    accepted = (window * rng.uniform(size=n)).astype(np.int64)
    conf = rng.uniform(size=(n, GAMMA))
    conf[rng.uniform(size=n) < 0.1] = np.nan
    conf[rng.uniform(size=(n, GAMMA)) < 0.02] = np.nan
    return batch, group, window, accepted, conf


def test_learning_in_batches_is_one_update_a_batch():
    """The model before each batch, stacked, gives each batch's rows the rates that the
    model updated one batch at a time gave them before their batch, to the last bit; after
    the last batch both models hold the same counts and reservoir."""
    batch, group, window, accepted, conf = _batched_blocks(3)
    batched = HazardModel(GAMMA, min_at_risk=5, reservoir=500)
    batched.update(group[:50], window[:50], accepted[:50], conf[:50])  # a state to start from
    one_by_one = HazardModel(GAMMA, min_at_risk=5, reservoir=500)
    one_by_one.update(group[:50], window[:50], accepted[:50], conf[:50])
    rest = slice(50, None)
    before = batched.learn_in_batches(
        batch[rest], group[rest], window[rest], accepted[rest], conf[rest]
    )
    stacked = batch[rest] * batched.groups + group[rest]
    got = before.rates(stacked, conf[rest])
    for b in np.unique(batch[rest]).tolist():
        rows = np.flatnonzero(batch[rest] == b) + 50
        want = one_by_one.rates(group[rows], conf[rows])
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g[rows - 50], w)
        one_by_one.update(group[rows], window[rows], accepted[rows], conf[rows])
    for name in ("_n0", "_d0", "_n", "_d", "_ccnt", "_csum", "_ring", "_fill", "_head"):
        np.testing.assert_array_equal(getattr(batched, name), getattr(one_by_one, name), name)
    assert batched.estimates() == one_by_one.estimates()
    with pytest.raises(ValueError, match="never decreasing"):
        batched.learn_in_batches(batch[::-1], group, window, accepted, conf)


def test_the_smooth_model_learnt_in_batches_is_one_update_a_batch():
    """The same for the smooth model of known positions: its rates before each batch and
    its refits (when a group's known positions grow by a tenth) are those of one `update`
    a batch."""
    from dspark_obs.estimator.confidence_rates import ConfidenceRates

    batch, group, window, _, conf = _batched_blocks(4)
    rng = np.random.default_rng(5)
    known = (np.arange(GAMMA)[None, :] < window[:, None]) & (rng.uniform(size=window.shape) < 0.8)[
        :, None
    ]
    ratio = np.clip(conf + rng.normal(0, 0.1, conf.shape), 0, 1)
    batched, one_by_one = ConfidenceRates(GAMMA), ConfidenceRates(GAMMA)
    before = batched.learn_in_batches(batch, group, known, ratio, conf, groups=4)
    assert batched.groups == 4
    got = before.rates(batch * 4 + group, conf)
    refits = 0
    for b in np.unique(batch).tolist():
        rows = np.flatnonzero(batch == b)
        np.testing.assert_array_equal(got[rows], one_by_one.rates(group[rows], conf[rows]))
        fitted = one_by_one._fitted_on.copy()
        one_by_one.update(group[rows], known[rows], ratio[rows], conf[rows])
        refits += int((one_by_one._fitted_on[: len(fitted)] != fitted).sum())
    assert refits > 10
    np.testing.assert_array_equal(batched._sums[:3], one_by_one._sums[:3])
    np.testing.assert_array_equal(batched._coef[:3], one_by_one._coef[:3])
