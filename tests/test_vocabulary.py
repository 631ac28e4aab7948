"""Our vocabulary over SGLang's record fields, defined once in `telemetry.batch`.

StepBatch keeps SGLang's names (verify_len, correct_drafts, acc_len, cap_trim); window,
accepted, committed and ceiling are derived from them in one place, and every reader
(the live aggregates' rows, the estimator, the tail walk) goes through that place.
"""

from __future__ import annotations

import numpy as np
import pytest

from dspark_obs.aggregates.rows import RequestRows
from dspark_obs.telemetry import StepBatch
from dspark_obs.telemetry.batch import (
    MODE_CAP_ACCEPT,
    MODE_CODE,
    MODE_COMPACT,
    MODE_STATIC,
    MODES,
    REQUEST_COLUMNS,
    VOCABULARY,
    ceiling_rule,
    empty_request_columns,
)

GAMMA = 4


def batch(mode: str, accepted, cap_trim, window=None) -> StepBatch:
    n = len(accepted)
    cols = empty_request_columns(n, GAMMA)
    accepted = np.asarray(accepted, np.int64)
    window = accepted if window is None else np.asarray(window, np.int64)
    cols.update(
        verify_len=window + 1,
        correct_drafts=accepted,
        acc_len=accepted + 1,
        cap_trim=np.asarray(cap_trim, np.int64),
        shadow_ceiling=np.full(n, -1, np.int64),
    )
    return StepBatch(forward_ct=0, gamma=GAMMA, mode=mode, **cols)


def test_every_mode_has_a_code_and_the_codes_are_the_named_ones():
    assert set(MODES) <= set(MODE_CODE)
    assert (MODE_CODE["static"], MODE_CODE["compact"], MODE_CODE["cap-accept"]) == (
        MODE_STATIC,
        MODE_COMPACT,
        MODE_CAP_ACCEPT,
    )
    assert MODE_CODE[""] == MODE_COMPACT  # an unlabelled step censors, as compact does


@pytest.mark.parametrize(
    "mode, want",
    [
        ("static", [0, 2, 4]),  # accepted
        ("cap-accept", [1, 4, 4]),  # accepted + cap_trim
        ("compact", [-1, -1, -1]),  # censored
        ("", [-1, -1, -1]),
    ],
)
def test_the_ceiling_rule_per_mode(mode, want):
    accepted, cap_trim = [0, 2, 4], [1, 2, 0]
    assert ceiling_rule(MODE_CODE[mode], np.array(accepted), np.array(cap_trim)).tolist() == want
    got = batch(mode, accepted, cap_trim).ceiling
    assert got.dtype == np.int64 and got.tolist() == want


def test_no_rows_and_codes_that_are_no_mode():
    empty = np.zeros(0, np.int64)
    for code in (*MODE_CODE.values(), 7):
        out = ceiling_rule(code, empty, empty)
        assert out.shape == (0,) and out.dtype == np.int64
    assert ceiling_rule(np.array([7, -1]), np.array([1, 1]), np.array([1, 1])).tolist() == [-1, -1]


def test_request_rows_apply_the_same_rule_per_step():
    steps = [
        batch("static", [0, 3], [0, 1]),
        batch("cap-accept", [1, 2], [3, 2]),
        batch("compact", [2], [0]),
    ]
    rows = RequestRows(steps, np.zeros(5, np.int64))
    want = np.concatenate([b.ceiling for b in steps])
    np.testing.assert_array_equal(rows.ceiling, want)
    assert want.tolist() == [0, 3, 4, 4, -1]


def test_our_names_are_derived_from_sglangs_once():
    b = batch("cap-accept", [0, 2, 3], [1, 0, 1], window=[2, 2, 4])
    np.testing.assert_array_equal(b.window, b.verify_len - 1)
    assert b.accepted is b.correct_drafts  # the same column, not a copy
    assert b.committed is b.acc_len
    np.testing.assert_array_equal(b.ceiling, b.correct_drafts + b.cap_trim)
    # the table names a StepBatch column for each of our names, and each name is a
    # property of StepBatch
    for ours, sources in VOCABULARY.items():
        assert isinstance(getattr(StepBatch, ours), property), ours
        for column in sources:
            assert column in REQUEST_COLUMNS, column


def test_request_rows_join_the_vocabulary_over_steps():
    steps = [batch("static", [0, 3], [0, 0], window=[1, 4]), batch("compact", [2], [0])]
    rows = RequestRows(steps, np.zeros(3, np.int64))
    assert rows.window.tolist() == [1, 4, 2]
    assert rows.accepted.tolist() == [0, 3, 2]
    assert rows.committed.tolist() == [1, 4, 3]
