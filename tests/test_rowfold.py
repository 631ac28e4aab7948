"""The compiled request-row fold (`aggregates/_rowfold.c`) against the numpy fold.

tests/test_aggregates.py checks every published number of both folds against
independent computations; here the two folds see the same awkward traffic side by
side (every mode, shadow twins on some rows, unscored steps, whole windows
accepted, several groups, ring turns) and must hold the same cells, and the C
functions must refuse arguments that would write outside their blocks.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dspark_obs.aggregates import Aggregates, confidence, tokens
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime

pytestmark = pytest.mark.skipif(tokens._rowfold is None, reason="the C fold is not built")
GAMMA = 7


def test_compiled_fold_is_built_and_shares_the_layout():
    """CI installs with a compiler, so the C fold must be there, laid out as the numpy one."""
    fold = tokens._rowfold
    assert fold is not None
    assert fold.N_HISTOGRAMS == len(tokens.HISTOGRAMS)
    assert (fold.ECE_BINS, fold.FINE_PER_ECE_BIN) == (
        confidence.ECE_BINS,
        confidence.FINE_PER_ECE_BIN,
    )


def runtime(steps: int, seed: int, **kw) -> list:
    config = RuntimeConfig(
        concurrency=[24], steps_per_level=steps, gamma=GAMMA, seed=seed, **kw
    )
    return list(DSparkRuntime(config).run())


def traffic() -> list:
    """Interleaved steps of every mode; every fifth compact step has no survival."""
    runs = [
        runtime(150, 1, mode="compact", shadow="cap-accept", shadow_fraction=0.5),
        [
            dataclasses.replace(b, rank=1, survival=None if b.forward_ct % 5 == 0 else b.survival)
            for b in runtime(150, 2, mode="compact")
        ],
        runtime(150, 3, mode="cap-accept"),
        runtime(150, 4, mode="static"),
    ]
    return [b for step in zip(*runs, strict=True) for b in step]


def folded(batches: list, compiled: bool, **kw) -> Aggregates:
    agg = Aggregates(GAMMA, compiled=compiled, window_steps=64, blocks=4, **kw)
    for b in batches:
        agg.update(b)
    agg.flush()
    return agg


@pytest.mark.parametrize("flush_rows", [1, 4096])
def test_both_folds_hold_the_same_cells(flush_rows):
    batches = traffic()
    # the traffic must reach every branch of the label rule
    compact = [b for b in batches if b.mode == "compact" and b.survival is not None]
    assert any((b.correct_drafts == b.window).any() for b in compact)
    assert any((b.shadow_ceiling >= 0).any() for b in compact)
    c, py = folded(batches, True, flush_rows=flush_rows), folded(batches, False, flush_rows=flush_rows)
    assert c.index.groups == py.index.groups and len(c.index.groups) >= 8
    for name in ("tokens", "confidence"):
        for sums in ("sums",) if name == "tokens" else ("fine", "coarse"):
            a, b = getattr(getattr(c, name), sums), getattr(getattr(py, name), sums)
            for read in ("total", "window"):
                x = a.total if read == "total" else a.window()
                y = b.total if read == "total" else b.window()
                if x.dtype == np.int64:
                    np.testing.assert_array_equal(x, y, err_msg=f"{name}.{sums} {read}")
                else:  # prediction sums: the same terms, added in another order
                    np.testing.assert_allclose(x, y, rtol=1e-12, atol=1e-12)
    assert c.confidence.fine.total.sum() > 0


@pytest.fixture
def blocks():
    agg = Aggregates(GAMMA, compiled=True)
    agg.tokens.sums.ensure_groups(2)
    agg.confidence.ensure_groups(2)
    return agg


def rows(n: int = 3, **over) -> dict:
    cols = {
        "group": np.array([0, 1, 1][:n], np.int64),
        "window": np.array([3, 7, 0][:n], np.int64),
        "accepted": np.array([1, 7, 0][:n], np.int64),
        "committed": np.array([2, 8, 1][:n], np.int64),
        "ceiling": np.array([-1, 7, 0][:n], np.int64),
        "shadow": np.array([2, -1, -1][:n], np.int64),
        "survival": np.linspace(0, 1, n * GAMMA).reshape(n, GAMMA),
    }
    cols.update(over)
    return cols


def call_tokens(agg: Aggregates, cols: dict) -> None:
    t = agg.tokens
    names = ("group", "window", "accepted", "committed", "ceiling", "shadow")
    tokens._rowfold.tokens(t.sums.current, t.sums.width, t._starts, *(cols[k] for k in names))


def call_confidence(agg: Aggregates, cols: dict) -> None:
    c = agg.confidence
    names = ("group", "survival", "accepted", "window", "ceiling")
    tokens._rowfold.confidence(
        c.fine.current, c.coarse.current, GAMMA, 1e-8, *(cols[k] for k in names)
    )


def test_a_hand_sized_case_lands_in_the_right_cells(blocks):
    """Three rows worked out by hand, one cell at a time."""
    call_tokens(blocks, rows())
    s = blocks.tokens.slices
    t = blocks.tokens.sums.total
    # row 0 (group 0): window 3, accepted 1, committed 2, shadow ceiling 2, known accepted 1
    assert t[0, s["window"]][3] == 1 and t[0, s["accepted"]][1] == 1
    assert t[0, s["committed"]][2] == 1 and t[0, s["ceiling_shadow"]][2] == 1
    assert t[0, s["accepted_known"]][1] == 1 and t[0, s["ceiling_observed"]].sum() == 0
    # rows 1 and 2 (group 1): observed ceilings 7 and 0
    assert t[1, s["ceiling_observed"]][[7, 0]].tolist() == [1, 1]
    assert t[1, s["accepted_known"]][[7, 0]].tolist() == [1, 1]
    assert t[1, s["ceiling_shadow"]].sum() == 0
    assert t.sum() == 3 * 5  # five histograms per row, every ceiling known


def test_compact_rows_reveal_only_what_they_saw(blocks):
    """A compact row (no ceiling) that accepted its whole window of 2 reveals positions 0
    and 1, both accepted; one that stopped at 1 of 3 reveals every position."""
    cols = rows(
        2,
        group=np.array([0, 0], np.int64),
        window=np.array([2, 3], np.int64),
        accepted=np.array([2, 1], np.int64),
        ceiling=np.array([-1, -1], np.int64),
        survival=np.full((2, GAMMA), 0.5),
    )
    call_confidence(blocks, cols)
    fine = blocks.confidence.fine.total.reshape(2, GAMMA, 2, -1)[0].sum(axis=-1)
    # [position, label]: both rows accept position 0; position 1 accepted by the first
    # row, rejected by the second; positions 2.. only from the second row, label 0
    expected = np.zeros((GAMMA, 2), np.int64)
    expected[0, 1] = 2
    expected[1] = [1, 1]
    expected[2:, 0] = 1
    np.testing.assert_array_equal(fine, expected)
    coarse = blocks.confidence.coarse.total.reshape(2, GAMMA, -1)[0]
    np.testing.assert_allclose(coarse[:, -1], fine.sum(axis=1) * 0.25)  # squared sums


@pytest.mark.parametrize(
    "call, over, message",
    [
        (call_tokens, {"group": np.array([0, 2, 1], np.int64)}, "validated range"),
        (call_tokens, {"group": np.array([0, -1, 1], np.int64)}, "validated range"),
        (call_tokens, {"window": np.array([3, 99, 0], np.int64)}, "validated range"),
        (call_tokens, {"shadow": np.array([2, -1], np.int64)}, "differ in length"),
        (call_tokens, {"window": np.array([3.0, 7.0, 0.0])}, "int64"),
        (call_confidence, {"group": np.array([0, 5, 1], np.int64)}, "validated range"),
        (call_confidence, {"survival": np.full((3, GAMMA), np.nan)}, "validated range"),
        (call_confidence, {"survival": np.zeros((3, GAMMA - 1))}, "differ in length"),
        (call_confidence, {"survival": np.zeros((GAMMA, 3)).T}, "C-ordered"),
    ],
)
def test_malformed_arguments_raise(blocks, call, over, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(blocks, rows(**over))


def test_blocks_that_do_not_fit_the_layout_raise(blocks):
    c = blocks.confidence
    cols = rows()
    with pytest.raises(ValueError, match="do not fit"):
        tokens._rowfold.confidence(
            c.fine.current, c.coarse.current[:, :-1].copy(), GAMMA, 1e-8,
            cols["group"], cols["survival"], cols["accepted"], cols["window"], cols["ceiling"],
        )  # fmt: skip
    with pytest.raises(ValueError, match="rows of"):
        t = blocks.tokens.sums
        tokens._rowfold.tokens(t.current, t.width + 1, blocks.tokens._starts, *(
            cols[k] for k in ("group", "window", "accepted", "committed", "ceiling", "shadow")
        ))  # fmt: skip
