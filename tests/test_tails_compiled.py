"""The C per-step pass of the tail walker against its numpy form, and against bad calls.

`test_tails.py` runs every hand-checked case and the reference comparison on
both passes; here the two passes walk the same runtime traffic side by side
(mixed greedy and sampled requests, in-band gathers, several ranks, slots
reused by new requests) and must emit the same blocks, and the compiled
functions must refuse malformed arguments with an exception, never a crash.
"""

from __future__ import annotations

import numpy as np
import pytest
from dspark_obs.estimator import interval, tails
from dspark_obs.estimator.tails import TailWalker

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime

pytestmark = pytest.mark.skipif(tails._tailwalk is None, reason="the C pass is not built")


def frames(walker: TailWalker, outs: list[dict]) -> dict[tuple[str, int], dict]:
    got = {}
    for out in outs:
        for i in range(len(out.get("rid", []))):
            key = (str(out["rid"][i]), int(out["open_fct"][i]))
            assert key not in got
            got[key] = {k: v[i] for k, v in out.items()}
    return got


@pytest.mark.parametrize(("mode", "concurrency"), [("compact", [64, 256]), ("cap-accept", [32])])
def test_compiled_pass_emits_what_the_numpy_pass_emits(mode, concurrency):
    config = RuntimeConfig(mode=mode, concurrency=concurrency, steps_per_level=120, seed=5)
    runtime = DSparkRuntime(config)
    walkers = {c: TailWalker(config.gamma, compiled=c, walk_every=7) for c in (False, True)}
    outs = {c: [] for c in walkers}
    for batch in runtime.run():
        group = (batch.req_pool_index % 3).astype(np.int64)
        # the rank alternates, so one-rank and multi-rank bookkeeping both run
        batch.rank = batch.forward_ct % 2
        for c, w in walkers.items():
            outs[c].append(w.step(batch, group, runtime.gather_target_logprobs, None))
    for c, w in walkers.items():
        outs[c].append(w.close(None))
    numpy_blocks, c_blocks = frames(walkers[False], outs[False]), frames(walkers[True], outs[True])
    assert set(numpy_blocks) == set(c_blocks)
    assert len(c_blocks) == walkers[True].opened == walkers[False].opened > 100
    assert walkers[True].skipped == walkers[False].skipped
    for key, want in numpy_blocks.items():
        have = c_blocks[key]
        for col in ("status", "greedy", "window", "group", "resolved_fct"):
            assert have[col] == want[col], (key, col)
        for col in ("lo", "point", "hi", "var"):
            # the C pass multiplies ratios in turn, numpy sums logs: the last bits may differ
            assert float(have[col]) == pytest.approx(float(want[col]), rel=1e-12, abs=1e-12)


def log_probs(rng, shape) -> np.ndarray:
    """Log-probabilities with the awkward values a walk meets: above and below each other,
    0 and 1 (-inf and 0), NaN (unknown), and +inf (no log-probability at all)."""
    x = rng.uniform(-8.0, 0.5, shape)
    pick = rng.random(shape)
    x[pick < 0.04] = -np.inf
    x[(pick >= 0.04) & (pick < 0.06)] = np.nan
    x[(pick >= 0.06) & (pick < 0.07)] = np.inf
    x[(pick >= 0.07) & (pick < 0.12)] = 0.0
    return x


@pytest.mark.parametrize("n", [1, 4, 7, 16, 64])
def test_the_running_product_arithmetic_is_the_python_one(n):
    """`_tailwalk.c`'s per-position accumulation (`evaluate`) against `interval.running_sums`
    over the same log-probabilities: every ratio rule (capped at 1, a zero probability, a
    NaN that poisons what follows), any start product and window, counted positions
    anywhere past the window. The C pass multiplies ratios in turn where numpy sums logs,
    so the last bits may differ."""
    rng = np.random.default_rng(n)
    k = 4000
    log_p, log_q = log_probs(rng, (k, n)), log_probs(rng, (k, n))
    window = rng.integers(0, n, k).astype(np.float64)
    counted = (np.arange(n)[None, :] >= window[:, None]) & (rng.random((k, n)) < 0.8)
    counted[: k // 4] = np.arange(n)[None, :] >= window[: k // 4, None]  # whole tails
    cum = rng.uniform(0.0, 1.0, k)
    cum[:10] = [0.0, 1.0, 1e-300, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0]
    with np.errstate(invalid="ignore"):
        want = interval.running_sums(
            interval.acceptance_log_ratio(log_p, log_q), counted, window, cum
        )
    got = tails._tailwalk.running_sums(log_p, log_q, counted, window, cum)
    for name, g, w in zip(("cum", "lo_extra", "var_terms"), got, want, strict=True):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=name)
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12, err_msg=name)


def test_the_running_products_by_hand():
    """Ratios capped at 1, halved, then a zero probability: products 1, 0.5, 0.5, 0 at
    tail drafts m = 1..4 (weights 2m - 1 = 1, 3, 5, 7), in both forms."""
    log_p = np.log([[0.9, 0.2, 0.3, 1.0]])
    log_p[0, 3] = -np.inf
    log_q = np.log([[0.5, 0.4, 0.3, 0.5]])
    counted, window, cum = np.ones((1, 4), bool), np.zeros(1), np.ones(1)
    ratio = interval.acceptance_log_ratio(log_p, log_q)
    for form in (
        tails._tailwalk.running_sums(log_p, log_q, counted, window, cum),
        interval.running_sums(ratio, counted, window, cum),
    ):
        assert [float(v[0]) for v in form] == pytest.approx([0.0, 2.0, 1 + 1.5 + 2.5], abs=1e-15)


def test_compiled_pass_refuses_malformed_arguments():
    """Unsafe dtypes, wrong shapes or rows out of bounds raise; the pool is left as it was."""
    w = TailWalker(4, compiled=True, walk_every=1)
    w._reserve(8)
    good = dict(
        prefix=np.zeros(2, np.int64),
        accepted=np.ones(2, np.int64),  # the whole window of 1 < gamma: both trimmed
        window=np.ones(2, np.int64),
        slot=np.arange(2, dtype=np.int64),
        greedy=np.ones(2, np.int8),
        group=np.zeros(2, np.int64),
        bonus=np.zeros(2, np.int64),
        bonus_lp=np.zeros(2),
        rid=np.array(["a", "b"], dtype=object),
        draft=np.ones((2, 4), np.int64),  # the bonus (0) differs from the first tail draft
    )
    requests = np.zeros((4, 8), np.int64)

    def call(**change):
        args = {**good, **change}
        return tails._tailwalk.advance(
            4, 1, 0, 0, True, -1, False,
            *args.values(), None, None, None,
            w.blk, w.blk_live, w.blk_rid, w.blk_tail, w.blk_q, w.blk_conf,
            w.free_blk, w.n_free, np.full(4, -1, np.int64),
            np.empty(2, bool), np.empty(2, bool),
            requests[0], requests[1], requests[2], requests[3],
            np.zeros(8, np.int64), np.zeros(8, np.int8),
        )  # fmt: skip

    before = w.blk.copy()
    for change in (
        {"prefix": np.zeros(2, np.float64)},  # not safely castable to int64
        {"prefix": np.zeros(3, np.int64)},
        {"draft": np.zeros((2, 3), np.int64)},
        {"slot": np.array([0, 9], np.int64)},  # beyond the slot map
        {"accepted": np.array([2, 0], np.int64)},  # accepted past the window
    ):
        with pytest.raises((ValueError, TypeError)):
            call(**change)
    assert np.array_equal(w.blk, before) and w.pending() == 0
    n_free, gathers, done, opened, skipped = call()
    # both rows open and resolve at once
    assert (n_free, gathers, done, opened, skipped) == (w.n_free - 2, 0, 2, 2, 0)
    # lists and other layouts convert like arrays; the first call's blocks are still live
    # (`finish` was not called) and the same prefix does not continue them: censored, so
    # 2 + 2 blocks are done
    again = call(prefix=[0, 0], rid=["a", "b"], draft=np.ones((4, 2), np.int64).T)
    assert again[2:] == (4, 2, 0)
