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

from dspark_obs.aggregates import Aggregates, confidence, rows, tokens
from dspark_obs.aggregates.rows import MODE_CODE
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.telemetry import StepBatch
from dspark_obs.telemetry.batch import ceiling_rule, empty_request_columns

pytestmark = pytest.mark.skipif(
    rows._rowfold is None, reason="the C fold is not built or DSPARK_OBS_NO_EXTENSIONS is set"
)
GAMMA = 7


def test_compiled_fold_shares_the_layout():
    """Laid out as the numpy one (whether it is built: tests/test_extensions.py)."""
    fold = rows._rowfold
    assert fold.N_HISTOGRAMS == len(tokens.HISTOGRAMS)
    assert (fold.ECE_BINS, fold.FINE_PER_ECE_BIN) == (
        confidence.ECE_BINS,
        confidence.FINE_PER_ECE_BIN,
    )
    assert (fold.MODE_STATIC, fold.MODE_CAP_ACCEPT) == (
        MODE_CODE["static"],
        MODE_CODE["cap-accept"],
    )


def test_the_folds_ceiling_helper_is_the_python_rule():
    """`_rowfold.c`'s ceiling helper against `ceiling_rule`, over every mode code (and codes
    that are no mode) and the edge values of accepted and cap_trim."""
    gamma = 64
    accepted, cap_trim = np.meshgrid(np.arange(gamma + 1), np.arange(gamma + 1))
    keep = accepted + cap_trim <= gamma  # the validated range: cap_trim <= gamma - accepted
    accepted, cap_trim = accepted[keep], cap_trim[keep]
    big = np.int64(2**62)  # far past any gamma, still without overflow
    accepted = np.concatenate([accepted, [big, 0, big - 1]])
    cap_trim = np.concatenate([cap_trim, [0, big, 1]])
    for code in (*sorted(set(MODE_CODE.values())), 3, -1, 2**40, -(2**40)):
        modes = np.full(len(accepted), code, np.int64)
        want = ceiling_rule(modes, accepted, cap_trim)
        np.testing.assert_array_equal(rows._rowfold.ceiling(modes, accepted, cap_trim), want)
        # the rule with one code for every row equals the rule row by row
        np.testing.assert_array_equal(ceiling_rule(code, accepted, cap_trim), want)
    rng = np.random.default_rng(0)
    modes = rng.integers(-1, 4, len(accepted))
    np.testing.assert_array_equal(
        rows._rowfold.ceiling(modes, accepted, cap_trim), ceiling_rule(modes, accepted, cap_trim)
    )
    with pytest.raises(ValueError, match="int64"):
        rows._rowfold.ceiling(modes.astype(np.int32), accepted, cap_trim)
    with pytest.raises(ValueError, match="one value per row"):
        rows._rowfold.ceiling(modes, accepted[:-1], cap_trim)


def runtime(steps: int, seed: int, **kw) -> list:
    config = RuntimeConfig(concurrency=[24], steps_per_level=steps, gamma=GAMMA, seed=seed, **kw)
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
    agg = Aggregates(GAMMA, compiled=compiled, window_steps=64, segments=4, **kw)
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
    c, py = (
        folded(batches, True, flush_rows=flush_rows),
        folded(batches, False, flush_rows=flush_rows),
    )
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
    for agg in (c, py):  # the fine window kept as rows arrive is the sum of the ring's blocks
        fine = agg.confidence.fine
        np.testing.assert_array_equal(fine.win, fine.ring.sum(axis=0))


@pytest.fixture
def blocks():
    agg = Aggregates(GAMMA, compiled=True)
    agg.tokens.sums.ensure_groups(2)
    agg.confidence.ensure_groups(2)
    return agg


def step(mode: str, survival=None, **cols) -> StepBatch:
    """A step of `len(verify_len)` rows: the given columns, the rest at their defaults."""
    n = len(cols["verify_len"])
    values = empty_request_columns(n, GAMMA)
    values.update(cap_trim=np.zeros(n, np.int64), shadow_ceiling=np.full(n, -1, np.int64))
    values.update({name: np.asarray(col, np.int64) for name, col in cols.items()})
    return StepBatch(forward_ct=0, gamma=GAMMA, mode=mode, **values, survival=survival)


def hand_steps(**over) -> tuple[list[StepBatch], np.ndarray]:
    """Row 0 (group 0) a compact row with a shadow twin; rows 1 and 2 (group 1) static."""
    survival = np.linspace(0, 1, 3 * GAMMA).reshape(3, GAMMA)
    steps = [
        step("compact", verify_len=[4], correct_drafts=[1], acc_len=[2], shadow_ceiling=[2],
             survival=survival[:1]),
        step("static", verify_len=[8, 1], correct_drafts=[7, 0], acc_len=[8, 1],
             survival=over.pop("survival", survival[1:])),
    ]  # fmt: skip
    for name, value in over.items():
        setattr(steps[1], name, value)
    return steps, np.array([0, 1, 1], np.int64)


def fold_tokens(agg: Aggregates, steps: list, group: np.ndarray, modes=None) -> None:
    t = agg.tokens
    modes = [MODE_CODE[b.mode] for b in steps] if modes is None else modes
    rows._rowfold.tokens(t.sums.current, t.sums.width, t._starts, steps, modes, group)


def fold_confidence(agg: Aggregates, steps: list, group: np.ndarray, modes=None) -> None:
    c = agg.confidence
    modes = [MODE_CODE[b.mode] for b in steps] if modes is None else modes
    rows._rowfold.confidence(
        c.fine.current, c.fine.win, c.coarse.current, GAMMA, 1e-8, steps, modes, group
    )


def test_a_hand_sized_case_lands_in_the_right_cells(blocks):
    """Three rows worked out by hand, one cell at a time."""
    steps, group = hand_steps()
    for b in steps:
        b.validate()
    fold_tokens(blocks, steps, group)
    s = blocks.tokens.slices
    t = blocks.tokens.sums.total
    # row 0 (group 0): window 3, accepted 1, committed 2, shadow ceiling 2, known accepted 1
    assert t[0, s["window"]][3] == 1 and t[0, s["accepted"]][1] == 1
    assert t[0, s["committed"]][2] == 1 and t[0, s["ceiling_shadow"]][2] == 1
    assert t[0, s["accepted_known"]][1] == 1 and t[0, s["ceiling_observed"]].sum() == 0
    # rows 1 and 2 (group 1): static, so observed ceilings 7 and 0
    assert t[1, s["ceiling_observed"]][[7, 0]].tolist() == [1, 1]
    assert t[1, s["accepted_known"]][[7, 0]].tolist() == [1, 1]
    assert t[1, s["ceiling_shadow"]].sum() == 0
    assert t.sum() == 3 * 5  # five histograms per row, every ceiling known


def test_compact_rows_reveal_only_what_they_saw(blocks):
    """A compact row (no ceiling) that accepted its whole window of 2 reveals positions 0
    and 1, both accepted; one that stopped at 1 of 3 reveals every position."""
    steps = [
        step("compact", verify_len=[3, 4], correct_drafts=[2, 1], acc_len=[3, 2],
             survival=np.full((2, GAMMA), 0.5)),
    ]  # fmt: skip
    fold_confidence(blocks, steps, np.array([0, 0], np.int64))
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


@pytest.mark.parametrize("fold", [fold_tokens, fold_confidence])
@pytest.mark.parametrize(
    "over, group, modes, message",
    [
        ({}, [0, 2, 1], None, "validated range"),
        ({}, [0, -1, 1], None, "validated range"),
        ({}, [0, 1], None, "fewer entries"),
        ({}, [0, 1, 1], [0], "one mode code"),
        ({"correct_drafts": np.array([7.0, 0.0])}, [0, 1, 1], None, "int64"),
        ({"acc_len": np.array([8, 1], np.int32)}, [0, 1, 1], None, "int64"),
        ({"verify_len": np.array([8, 1, 1])}, [0, 1, 1], None, "one value per row"),
    ],
)
def test_malformed_arguments_raise(blocks, fold, over, group, modes, message):
    steps, _ = hand_steps(**over)
    with pytest.raises(ValueError, match=message):
        fold(blocks, steps, np.array(group, np.int64), modes)


@pytest.mark.parametrize(
    "survival, message",
    [
        (np.full((2, GAMMA), np.nan), "validated range"),
        (np.zeros((2, GAMMA - 1)), r"\[rows, gamma\]"),
        (np.zeros((GAMMA, 2)).T, r"\[rows, gamma\]"),
    ],
)
def test_malformed_survival_raises(blocks, survival, message):
    steps, group = hand_steps(survival=survival)
    with pytest.raises(ValueError, match=message):
        fold_confidence(blocks, steps, group)


def test_ranges_beyond_the_histograms_raise(blocks):
    """A window past gamma would land in the next histogram's cells: refused."""
    steps, group = hand_steps(verify_len=np.array([99, 1]))
    with pytest.raises(ValueError, match="validated range"):
        fold_tokens(blocks, steps, group)


def test_blocks_that_do_not_fit_the_layout_raise(blocks):
    steps, group = hand_steps()
    c, t = blocks.confidence, blocks.tokens
    modes = [MODE_CODE[b.mode] for b in steps]
    with pytest.raises(ValueError, match="different groups"):
        rows._rowfold.confidence(
            c.fine.current,
            c.fine.win,
            c.coarse.current[:1].copy(),
            GAMMA,
            1e-8,
            steps,
            modes,
            group,
        )
    with pytest.raises(ValueError, match="different groups"):
        rows._rowfold.confidence(
            c.fine.current,
            c.fine.win[:1].copy(),
            c.coarse.current,
            GAMMA,
            1e-8,
            steps,
            modes,
            group,
        )
    with pytest.raises(ValueError, match="block of rows"):
        rows._rowfold.tokens(t.sums.current, t.sums.width + 1, t._starts, steps, modes, group)
    with pytest.raises(ValueError, match="block of rows"):
        frozen = t.sums.current.copy()
        frozen.flags.writeable = False
        rows._rowfold.tokens(frozen, t.sums.width, t._starts, steps, modes, group)
