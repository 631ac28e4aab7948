"""The acceptance rule: sampled output follows the target; greedy keeps argmax matches."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from dspark_obs.runtime.acceptance import (
    accept_probability,
    leading_run,
    log_softmax,
    residual,
    sample,
)

V = 5
DRAWS = 40_000


def _speculative_draw(p: np.ndarray, q: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One speculative position per row: draft from q, accept min(1, p/q), else residual."""
    n = DRAWS
    pr, qr = np.tile(p, (n, 1)), np.tile(q, (n, 1))
    x = sample(qr, rng.random(n))
    rows = np.arange(n)
    ok = rng.random(n) < accept_probability(np.log(pr[rows, x]), np.log(qr[rows, x]))
    replacement = sample(residual(pr, qr), rng.random(n))
    return np.where(ok, x, replacement)


dists = st.lists(st.floats(0.02, 1.0), min_size=V, max_size=V).map(
    lambda w: np.asarray(w) / np.sum(w)
)


@settings(max_examples=25, deadline=None, derandomize=True, database=None)
@given(p=dists, q=dists, seed=st.integers(0, 2**32 - 1))
def test_sampled_output_follows_target(p, q, seed):
    out = _speculative_draw(p, q, np.random.default_rng(seed))
    counts = np.bincount(out, minlength=V)
    _, pvalue = chisquare(counts, DRAWS * p)
    assert pvalue > 1e-4, (p, q, counts / DRAWS)


def test_chi_square_detects_a_wrong_rule():
    """The test above can fail: accepting every draft yields q, and chi-square rejects it."""
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.2, 0.1, 0.1, 0.1])
    q = np.array([0.1, 0.1, 0.2, 0.2, 0.4])
    wrong = sample(np.tile(q, (DRAWS, 1)), rng.random(DRAWS))
    _, pvalue = chisquare(np.bincount(wrong, minlength=V), DRAWS * p)
    assert pvalue < 1e-12


def test_inverse_cdf_sample_matches_hand_computation():
    probs = np.array([[0.2, 0.3, 0.5]] * 4)
    u = np.array([0.0, 0.19999, 0.2, 0.99999])
    assert sample(probs, u).tolist() == [0, 0, 1, 2]


def test_residual_is_positive_part_and_falls_back_to_p():
    p = np.array([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    q = np.array([[0.2, 0.5, 0.3], [0.2, 0.3, 0.5]])
    r = residual(p, q)
    np.testing.assert_allclose(r[0], [0.3, 0.0, 0.0])
    np.testing.assert_allclose(r[1], p[1])


@given(st.lists(st.lists(st.booleans(), min_size=7, max_size=7), min_size=1, max_size=20))
def test_leading_run_counts_leading_true(rows):
    a = np.array(rows)
    expected = [next((i for i, v in enumerate(r) if not v), len(r)) for r in rows]
    assert leading_run(a).tolist() == expected


def test_log_softmax_temperature():
    logits = np.array([[1.0, 2.0, 3.0]])
    lp = log_softmax(logits, np.array([0.5]))
    z = np.exp(logits[0] / 0.5)
    np.testing.assert_allclose(np.exp(lp[0]), z / z.sum())
