"""The C per-step pass of the tail walker against its numpy form, and against bad calls.

`test_tails.py` runs every hand-checked case and the reference comparison on
both passes; here the two passes walk the same runtime traffic side by side
(mixed greedy and sampled requests, in-band gathers, several ranks, slots
reused by new requests) and must emit the same blocks, and the compiled
functions must refuse malformed arguments with an exception, never a crash.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from dspark_obs.estimator import interval, tails
from dspark_obs.estimator.tails import TailWalker

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.telemetry import StepBatch

pytestmark = pytest.mark.skipif(
    tails._tailwalk is None, reason="the C pass is not built or DSPARK_OBS_NO_EXTENSIONS is set"
)


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


def step_of(**columns) -> SimpleNamespace:
    """What the compiled pass reads of a step: two rows of window 1 < gamma 4, both
    accepted whole (so both trimmed, greedy), the bonus 0 differing from the first tail
    draft 1; `columns` replaces any of them."""
    step = dict(
        forward_ct=0,
        rank=0,
        prefix_len=np.zeros(2, np.int64),
        correct_drafts=np.ones(2, np.int64),
        verify_len=np.full(2, 2, np.int64),
        req_pool_index=np.arange(2, dtype=np.int64),
        greedy=np.ones(2, np.int8),
        bonus_token=np.zeros(2, np.int64),
        bonus_logprob=np.zeros(2),
        rid=np.array(["a", "b"], dtype=object),
        draft_tokens=np.ones((2, 4), np.int64),
        target_logprobs=None,
        draft_logprobs=None,
        confidence=None,
    )
    return SimpleNamespace(**{**step, **columns})


def batch_of(**columns) -> StepBatch:
    """`step_of` as a StepBatch (the walker's `step` takes whole batches)."""
    c = step_of(**columns)
    n = len(c.prefix_len)
    return StepBatch(
        forward_ct=c.forward_ct, gamma=4, mode="compact", rank=c.rank, rid=c.rid,
        workload=np.full(n, "w", dtype=object), req_pool_index=c.req_pool_index,
        prefix_len=c.prefix_len, verify_len=c.verify_len, correct_drafts=c.correct_drafts,
        acc_len=c.correct_drafts + 1, cap_trim=np.zeros(n, np.int64), bonus_token=c.bonus_token,
        greedy=c.greedy, temperature=np.full(n, np.nan), shadow_ceiling=np.full(n, -1),
        bonus_logprob=c.bonus_logprob, draft_tokens=c.draft_tokens, confidence=c.confidence,
        draft_logprobs=c.draft_logprobs, target_logprobs=c.target_logprobs,
    )  # fmt: skip


def bound_walker() -> TailWalker:
    w = TailWalker(4, compiled=True, walk_every=1)
    w.row_of = np.full(4, -1, np.int64)
    w._reserve(8)
    room = 2 * len(w.blk)  # settled buffers with room for the whole pool, twice
    w.set_f = np.zeros((room, tails._FIELDS))
    w.set_rid = np.full(room, None, dtype=object)
    w.set_conf = np.zeros((room, 4))
    w._bind()
    return w


def test_compiled_pass_refuses_malformed_arguments():
    """Unsafe dtypes, wrong shapes or rows out of bounds raise; the pool is left as it was."""
    w = bound_walker()
    group = np.zeros(2, np.int64)
    before = w.blk.copy()
    for change in (
        {"prefix_len": np.zeros(2, np.float64)},  # not safely castable to int64
        {"prefix_len": np.zeros(3, np.int64)},
        {"draft_tokens": np.zeros((2, 3), np.int64)},
        {"req_pool_index": np.array([0, 9], np.int64)},  # beyond the slot map
        {"correct_drafts": np.array([2, 0], np.int64)},  # accepted past the window
        {"rid": None},
    ):
        with pytest.raises((ValueError, TypeError)):
            w._pool.advance(step_of(**change), group, 1, True)
    with pytest.raises(ValueError, match="group"):
        w._pool.advance(step_of(), np.zeros(3, np.int64), 1, True)
    with pytest.raises(AttributeError):
        w._pool.advance(object(), group, 1, True)
    assert np.array_equal(w.blk, before) and w.pending() == 0
    assert (w.row_of == -1).all()
    n_free = w.n_free
    gathers, done, opened, skipped, n_opened, n_skipped = w._pool.advance(step_of(), group, 1, True)
    # both rows open and resolve at once (the bonus differs from the first tail draft)
    assert (gathers, done, n_opened, n_skipped) == (None, 2, 2, 0)
    assert opened.tolist() == [True, True] and skipped.tolist() == [False, False]
    assert w.n_free == n_free - 2 and w.pending() == 2
    with pytest.raises(ValueError, match="log_p"):
        w._pool.finish(np.zeros((1, 1)))
    w._pool.finish(None)
    assert w.n_free == n_free and w.set_count == 2 and w.pending() == 0
    assert w.set_rid[:2].tolist() == ["a", "b"]
    # lists and other layouts convert like arrays
    again = step_of(prefix_len=[0, 0], rid=["a", "b"], draft_tokens=np.ones((4, 2), np.int64).T)
    assert w._pool.advance(again, group, 2, True)[1] == 2


def test_the_pool_refuses_arrays_that_do_not_fit():
    w = bound_walker()
    arrays = dict(
        counters=w._counters, blk=w.blk, live=w.blk_live, prid=w.blk_rid, ptail=w.blk_tail,
        pq=w.blk_q, pconf=w.blk_conf, freestack=w.free_blk, row_of=w.row_of, set_f=w.set_f,
        set_rid=w.set_rid, set_conf=w.set_conf, away=w.away,
    )  # fmt: skip
    tails._tailwalk.Pool(4, -1, **arrays)
    frozen = w.blk_q.copy()
    frozen.flags.writeable = False
    for name, bad in (
        ("counters", np.zeros(3, np.int64)),
        ("blk", w.blk[:, :-1].copy()),
        ("live", w.blk_live.astype(np.int8)),
        ("ptail", w.blk_tail[:-1]),
        ("pq", frozen),
        ("pconf", np.asfortranarray(np.zeros((len(w.blk), 4)))),
        ("freestack", w.free_blk.astype(np.int32)),
        ("set_rid", w.set_rid[:-1].copy()),
        ("set_conf", np.zeros((len(w.set_f), 3))),
        ("row_of", [-1, -1]),
        ("away", []),
    ):
        with pytest.raises((ValueError, TypeError)):
            tails._tailwalk.Pool(4, -1, **{**arrays, name: bad})
    for gamma, assume in ((0, -1), (65, -1), (4, 2)):
        with pytest.raises(ValueError):
            tails._tailwalk.Pool(gamma, assume, **arrays)


@pytest.mark.parametrize("bad_id", ["negative", "past the pool", "in use"])
def test_a_free_slot_id_outside_the_pool_is_refused(bad_id):
    """A free stack holding an id outside the pool, or one in use, raises ValueError; the
    slot map is restored, the blocks found done settle, and the next step (the stack
    mended) walks normally."""
    w = bound_walker()
    group = np.zeros(2, np.int64)
    # one block stays open: its bonus (2) matches the first tail draft, the tail goes on
    w._pool.advance(step_of(bonus_token=np.array([2, 0]), draft_tokens=np.array(
        [[1, 2, 3, 4], [1, 1, 1, 1]])), group, 1, True)  # fmt: skip
    w._pool.finish(None)
    assert w.pending() == 1
    live = int(np.flatnonzero(w.blk_live)[0])
    top = w.n_free - 1
    saved = int(w.free_blk[top])
    w.free_blk[top] = {"negative": -1, "past the pool": len(w.blk), "in use": live}[bad_id]
    with pytest.raises(ValueError, match="free-slot id"):
        w._pool.advance(step_of(forward_ct=1, prefix_len=np.array([5, 5])), group, 2, True)
    assert (w.row_of == -1).all()
    # nothing taken; the open block, whose request did not continue (prefix 5), was found
    # done before the error and left the pool, censored, its id back on the stack
    assert w.pending() == 0 and w.n_free == top + 2
    w.free_blk[top] = saved
    result = w._pool.advance(step_of(forward_ct=2, prefix_len=np.array([9, 9])), group, 3, True)
    assert result[1] == 2 and result[4] == 2  # both rows open a block and resolve at once
    w._pool.finish(None)
    assert (w.row_of == -1).all() and w.pending() == 0


class RaisingRid:
    """A rid whose comparison fails, as a broken source object might."""

    def __eq__(self, other):
        raise RuntimeError("cannot compare")

    __hash__ = object.__hash__


def test_an_error_in_the_walk_restores_the_slot_map_and_the_next_step_walks():
    """The rid comparison raises halfway through the pool: the error comes out, row_of is
    all -1 again, the blocks already found done are settled as censored, and a following
    normal step walks as if nothing had happened."""
    w = TailWalker(4, compiled=True, walk_every=1)
    group = np.zeros(3, np.int64)
    # three greedy blocks stay open (each bonus matches its first tail draft)
    first = batch_of(
        prefix_len=np.zeros(3, np.int64), correct_drafts=np.ones(3, np.int64),
        verify_len=np.full(3, 2), req_pool_index=np.arange(3, dtype=np.int64),
        greedy=np.ones(3, np.int8), bonus_token=np.full(3, 2), bonus_logprob=np.zeros(3),
        rid=np.array(["a", "b", "c"], dtype=object), draft_tokens=np.tile([1, 2, 3, 4], (3, 1)),
    )  # fmt: skip
    w.step(first, group)
    assert w.pending() == 3
    # a shows up past where it left off (censors its block), slot 1's rid raises on compare
    second = batch_of(
        forward_ct=1, prefix_len=np.array([5, 2, 2]), correct_drafts=np.zeros(3, np.int64),
        verify_len=np.full(3, 2), req_pool_index=np.arange(3, dtype=np.int64),
        greedy=np.ones(3, np.int8), bonus_token=np.full(3, 3), bonus_logprob=np.zeros(3),
        rid=np.array(["a", RaisingRid(), "c"], dtype=object),
        draft_tokens=np.tile([9, 9, 9, 9], (3, 1)),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="cannot compare"):
        w.step(second, group)
    assert (w.row_of == -1).all()
    out = w.settle(None, 1)
    assert out["rid"].tolist() == ["a"] and out["status"].tolist() == [2]  # censored
    assert w.pending() == 2
    # the next step: b's slot shows another request (b is parked), c continues (its bonus
    # 3 matches)
    third = batch_of(
        forward_ct=2, prefix_len=np.array([0, 0, 2]), correct_drafts=np.zeros(3, np.int64),
        verify_len=np.full(3, 2), req_pool_index=np.arange(3, dtype=np.int64),
        greedy=np.ones(3, np.int8), bonus_token=np.full(3, 3), bonus_logprob=np.zeros(3),
        rid=np.array(["y", "x", "c"], dtype=object), draft_tokens=np.tile([9, 9, 9, 9], (3, 1)),
    )  # fmt: skip
    assert w.step(third, group) == {}
    assert (w.row_of == -1).all() and w.pending() == 2 and list(w.away) == ["b"]
    # b comes back in slot 5 where it left off; its bonus 7 differs from its tail's 3
    fourth = batch_of(
        forward_ct=3, prefix_len=np.array([2]), correct_drafts=np.zeros(1, np.int64),
        verify_len=np.full(1, 2), req_pool_index=np.array([5]), greedy=np.ones(1, np.int8),
        bonus_token=np.array([7]), bonus_logprob=np.zeros(1), rid=np.array(["b"], dtype=object),
        draft_tokens=np.array([[9, 9, 9, 9]]),
    )  # fmt: skip
    out = w.step(fourth, group[:1])
    assert out["rid"].tolist() == ["b"] and out["status"].tolist() == [1]
    assert out["lo"].tolist() == [2.0]  # window 1 + the bonus that matched in the first step
    assert list(w.away) == ["c"] and w.pending() == 1  # c was not in that step
    out = w.close()
    assert out["rid"].tolist() == ["c"] and out["lo"].tolist() == [3.0]  # and position 2
    assert w.away == {}


def test_a_failed_gather_or_finish_abandons_the_step():
    """The step's done blocks leave the pool censored, and the walker goes on."""
    w = TailWalker(4, compiled=True, walk_every=1000)
    group = np.zeros(1, np.int64)
    lp = np.log(np.full((1, 4), 0.5))
    sampled = dict(greedy=np.zeros(1, np.int8), draft_logprobs=lp, target_logprobs=lp,
                   bonus_logprob=np.log([0.5]), rid=np.array(["s"], dtype=object),
                   req_pool_index=np.zeros(1, np.int64))  # fmt: skip

    def broken(rows, offsets, tokens):
        raise OSError("the verify table is gone")

    opening = batch_of(prefix_len=np.zeros(1, np.int64), correct_drafts=np.ones(1, np.int64),
                      verify_len=np.full(1, 2), bonus_token=np.array([7]),
                      draft_tokens=np.array([[1, 2, 3, 4]]), **sampled)  # fmt: skip
    with pytest.raises(OSError):
        w.step(opening, group, broken)  # the bonus 7 mismatches the tail's 2: a gather
    assert w.pending() == 0 and (w.row_of == -1).all()  # abandoned: settled, censored
    out = w.settle(None, 0)
    assert out["rid"].tolist() == ["s"] and out["status"].tolist() == [2]
    # by hand: a pending step must be finished or abandoned before the next
    w._pool.advance(opening, group, w.steps + 1, True)
    assert w.pending() == 1
    with pytest.raises(ValueError, match="neither finished nor abandoned"):
        w._pool.advance(opening, group, w.steps + 1, True)
    with pytest.raises(ValueError, match="fewer values"):
        w._pool.finish(np.zeros(0))  # the one gather still pending needs its value
    assert w.pending() == 1
    w._pool.abandon()
    assert w.pending() == 0
    w._pool.abandon()  # nothing pending: nothing to do
    # a gather answering with too few values: the finish fails, the walker abandons
    with pytest.raises(ValueError, match="fewer values"):
        w.step(opening, group, lambda rows, offsets, tokens: np.zeros(0))
    assert w.pending() == 0
    w.step(batch_of(forward_ct=1, prefix_len=np.array([30]), correct_drafts=np.zeros(1, np.int64),
                   verify_len=np.full(1, 2), bonus_token=np.array([1]),
                   draft_tokens=np.array([[1, 1, 1, 1]]), **{**sampled, "rid": np.array(
                       ["t"], dtype=object)}), group)  # fmt: skip
    out = w.settle(None, 1)
    assert out["rid"].tolist() == ["s", "s"] and (out["status"] == 2).all()
    assert w.pending() == 0
