"""A block's ceiling interval, defined once (`estimator/interval.py`) for both walks.

The tail walk over in-band steps and the walk over SGLang's block-accept JSONL see
the same block the same way; the interval's own rules (bounds by construction,
exact blocks collapse, NaN poisons only what follows) hold for any input.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from dspark_obs.estimator import interval, tails
from dspark_obs.estimator.block_accept_walk import walk_blocks
from dspark_obs.estimator.population import HazardModel
from dspark_obs.estimator.tails import TailWalker
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dspark_obs.telemetry.block_accept_log import read_block_accept_jsonl

from .interval_reference import chernoff_margin
from .test_tails import make_batch, sampled

PASSES = [False] + ([True] if tails._tailwalk is not None else [])
GAMMA = 4
LN = math.log


def tail_walk_of_one_block(compiled: bool, extrapolate=None) -> dict:
    """Block S (window 1, tail [2, 3, 4] drafted with q 0.5, 0.5, 0.4): the bonus matches
    the first tail draft (p 0.25), the next step commits 6 where the tail has 3 (p 0.2)."""
    q = [0.9, 0.5, 0.5, 0.4]
    steps = [
        make_batch(0, [sampled("S", 0, 0, 1, 1, [1, 2, 3, 4], 2, q=q, p=[0.8] * 4, bonus_p=0.25)]),
        make_batch(1, [sampled("S", 0, 2, 2, 0, [5] * 4, 6, q=[0.5] * 4, p=[0.3] * 4,
                               bonus_p=0.1)]),
    ]  # fmt: skip
    tw = TailWalker(GAMMA, walk_every=1, compiled=compiled)

    def gather(rows, positions, tokens):
        assert tokens.tolist() == [3]
        return np.log([0.2])

    out = [tw.step(b, np.zeros(b.num_reqs, np.int64), gather, extrapolate) for b in steps]
    assert out[0] == {}
    return out[1]


def block_accept_walk_of_one_block(extrapolate=None) -> dict:
    """The same block as SGLang's block-accept JSONL records it."""
    lines = [
        {"rid": "S", "fct": 0, "w": 1, "cl": 1, "ct": 0, "trimmed_tokens": [2, 3, 4],
         "q_lp": [LN(0.5), LN(0.5), LN(0.4)], "pg": [[0, 2, LN(0.25), 2, 2]]},
        {"rid": "S", "fct": 1, "w": 2, "cl": 0, "ct": 0, "pg": [[0, 3, LN(0.2), 3, 6]]},
    ]  # fmt: skip
    log = read_block_accept_jsonl([json.dumps(x) for x in lines])
    return walk_blocks(log, GAMMA, extrapolate)


@pytest.mark.parametrize("compiled", PASSES, ids=lambda c: "compiled" if c else "numpy")
def test_both_walks_give_one_block_the_same_interval(compiled):
    ours, sglang = tail_walk_of_one_block(compiled), block_accept_walk_of_one_block()
    # P_1 = min(1, 0.25 / 0.5) = 0.5, P_2 = 0.5 * min(1, 0.2 / 0.5) = 0.2; one position left
    lo, var = 1 + 0.5 + 0.2, (1 * 0.5 + 3 * 0.2) - 0.7**2
    for out in (ours, sglang):
        assert out["lo"][0] == pytest.approx(lo, abs=1e-12)
        assert out["hi"][0] == pytest.approx(lo + 0.2 * 1, abs=1e-12)
        assert out["var"][0] == pytest.approx(var, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 50),
    data=st.data(),
)
def test_the_interval_brackets_its_point_whatever_the_extrapolation(n, data):
    window = data.draw(hnp.arrays(np.float64, n, elements=st.integers(0, 63)))
    lo_extra = data.draw(hnp.arrays(np.float64, n, elements=st.floats(0, 64)))
    var_terms = data.draw(hnp.arrays(np.float64, n, elements=st.floats(0, 64**3)))
    reach = data.draw(hnp.arrays(np.float64, n, elements=st.floats(0, 1)))
    unreached = data.draw(hnp.arrays(np.int64, n, elements=st.integers(0, 64)))
    extra = data.draw(
        hnp.arrays(np.float64, n, elements=st.floats(allow_nan=True, allow_infinity=True))
    )
    out = interval.block_interval(window, lo_extra, var_terms, reach, unreached, extra)
    assert (out["lo"] == window + lo_extra).all()
    assert (out["lo"] <= out["point"]).all() and (out["point"] <= out["hi"]).all()
    assert (out["var"] >= 0).all()
    done = unreached == 0  # nothing left: the interval is a point
    assert (out["hi"][done] == out["lo"][done]).all()
    assert (out["point"][done] == out["lo"][done]).all()


def test_a_nan_ratio_poisons_only_what_follows_it():
    log_ratio = np.log([[0.5, 1.0, 0.5, 0.5]])
    log_ratio[0, 2] = np.nan
    counted = np.array([[True, True, True, True]])
    cum, lo_extra, var_terms = interval.running_sums(log_ratio, counted, np.zeros(1), np.ones(1))
    assert np.isnan(cum[0]) and np.isnan(lo_extra[0]) and np.isnan(var_terms[0])
    # not counted, a NaN changes nothing
    counted[0, 2:] = False
    cum, lo_extra, var_terms = interval.running_sums(log_ratio, counted, np.zeros(1), np.ones(1))
    assert (cum[0], lo_extra[0], var_terms[0]) == pytest.approx((0.5, 1.0, 0.5 + 1.5))


def test_a_zero_probability_ends_the_products_without_poisoning_earlier_ones():
    ratio = interval.acceptance_log_ratio(np.array([[-1.0, -np.inf, 0.0]]), np.zeros((1, 3)))
    assert np.isfinite(ratio).all()
    cum, lo_extra, _ = interval.running_sums(ratio, np.ones((1, 3), bool), np.zeros(1), np.ones(1))
    assert cum[0] == 0.0 and lo_extra[0] == pytest.approx(math.exp(-1.0))


@pytest.mark.parametrize("compiled", PASSES, ids=lambda c: "compiled" if c else "numpy")
def test_one_extrapolation_signature_serves_both_walks_and_the_population_model(compiled):
    """`interval.Extrapolate`: the same callable (rates, or the population model's
    `expected_extra`) extrapolates the same block in either walk, asked the same way."""
    model = HazardModel(GAMMA)
    model.update(np.zeros(50, np.int64), np.full(50, 3), np.arange(50) % 4, None)
    calls: list = []

    def recorded(extrapolate):
        def wrapper(groups, start, confidence):
            calls.append((groups.tolist(), start.tolist()))
            return extrapolate(groups, start, confidence)

        return wrapper

    for extrapolate in (interval.rate_extrapolation([0.9, 0.8, 0.7, 0.6]), model.expected_extra):
        ours = tail_walk_of_one_block(compiled, recorded(extrapolate))
        sglang = block_accept_walk_of_one_block(recorded(extrapolate))
        assert calls[-2:] == [([0], [3]), ([0], [3])]  # position 3 is the one unreached
        # the tail walk hands over the block's confidence (0.5 at each position), the file
        # has none
        for out, confidence in ((ours, np.full((1, GAMMA), 0.5)), (sglang, None)):
            want = extrapolate(np.zeros(1, np.int64), np.array([3]), confidence)[0]
            assert out["point"][0] == pytest.approx(1.7 + 0.2 * want, abs=1e-12)
            assert out["lo"][0] < out["point"][0] < out["hi"][0]


def test_rate_extrapolation_by_hand():
    extrapolate = interval.rate_extrapolation([0.5, 2.0, -1.0])  # clipped to 0.5, 1, 0
    got = extrapolate(np.zeros(4, np.int64), np.array([0, 1, 2, 3]), None)
    # from 2: 0; from 1: 1 * (1 + 0) = 1; from 0: 0.5 * (1 + 1) = 1; past the end: 0
    assert got.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_an_extrapolation_of_the_wrong_shape_is_refused():
    def wrong(groups, start, confidence):
        return np.zeros(len(start) + 1)

    with pytest.raises(ValueError, match="shape"):
        interval.extrapolated_extra(wrong, np.zeros(2, np.int64), np.ones(2, np.int64), None,
                                    np.ones(2, np.int64))  # fmt: skip
    # nothing unreached: not asked at all
    none = interval.extrapolated_extra(wrong, np.zeros(2, np.int64), np.ones(2, np.int64), None,
                                       np.zeros(2, np.int64))  # fmt: skip
    assert none.tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    "var, bound", [(10.0, 7.0), (3452.0, 7.0), (0.5, 7.0), (1e-6, 7.0), (100.0, 0.3)]
)
def test_bennett_margin_is_the_chernoff_bound(var, bound):
    """Newton on Bennett's equation against the Chernoff bound minimised over s directly."""
    assert interval.bennett_margin(var, bound) == pytest.approx(
        chernoff_margin(var, bound), rel=1e-9
    )


def test_bennett_margin_limits():
    assert interval.bennett_margin(0.0, 7.0) == 0.0
    # no block above its mean by anything: the sub-Gaussian bound sqrt(2 var log 40)
    assert interval.bennett_margin(10.0, 0.0) == pytest.approx(math.sqrt(20 * math.log(40)))
    # many blocks: the margin in standard errors falls towards sqrt(2 log 40) = 2.72
    per_se = [interval.bennett_margin(v, 6.0) / math.sqrt(v) for v in (1e2, 1e4, 1e6)]
    assert per_se[0] > per_se[1] > per_se[2] > math.sqrt(2 * math.log(40))
    assert per_se[2] == pytest.approx(math.sqrt(2 * math.log(40)), rel=0.01)


@pytest.mark.parametrize("n, p, jump", [(20, 0.1, 6), (5, 0.02, 6), (40, 0.3, 3), (200, 0.05, 5)])
def test_bennett_margin_holds_for_a_skewed_sum(n, p, jump):
    """n blocks, each `jump` with chance p, else 0 (a walk that diverged at once, its tail
    running on to gamma once reached): the sum passes its mean plus the margin with chance
    at most 2.5 %, exactly (binomial law)."""
    mean, var = n * p * jump, n * p * (1 - p) * jump**2
    t = interval.bennett_margin(var, jump * (1 - p))
    x = np.arange(n + 1)
    law = np.array([math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in x])
    assert law[x * jump > mean + t].sum() <= 0.025


def test_aggregate_interval_stays_within_what_ceilings_can_be():
    """Two blocks of window 1 and gamma 3: the realised mean lies in [1, 3] whatever
    happens, and the interval does not reach past it."""
    lo, hi = interval.aggregate_interval(
        2, lo=2.2, hi=2.8, var=0.3, var_hi=1.5, bound_lo=0.2, bound_hi=1.6, least=2.0, most=6.0
    )
    assert (lo, hi) == (1.0, 3.0)
