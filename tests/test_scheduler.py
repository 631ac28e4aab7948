"""The confidence scheduler against brute force on small batches."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.domain.cost_table import AdditiveCostTable, default_cost_table, round_to_tier
from dspark_obs.runtime.scheduler import schedule

TABLE = AdditiveCostTable(
    bias_seconds=0.002,
    bs_probes=[1, 4],
    alpha_seconds=[0.001, 0.002],
    m_probes=[1, 4, 8, 16],
    theta_seconds=[0.004, 0.004, 0.006, 0.012],
)


def _brute_force(survival: np.ndarray, table: AdditiveCostTable) -> float:
    bs, gamma = survival.shape
    best = -1.0
    for windows in itertools.product(range(gamma + 1), repeat=bs):
        k = sum(windows)
        gain = sum(survival[b, :w].sum() for b, w in enumerate(windows))
        best = max(best, (bs + gain) / float(table.step_seconds(bs, k)))
    return best


survivals = (
    st.integers(1, 3)
    .flatmap(
        lambda bs: st.lists(
            st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3), min_size=bs, max_size=bs
        )
    )
    .map(lambda rows: np.cumprod(np.asarray(rows), axis=1))
)


@settings(max_examples=60, deadline=None)
@given(survivals)
def test_schedule_is_optimal_and_contiguous(survival):
    plan = schedule(survival, TABLE)
    assert plan.windows.sum() == plan.budget
    gain = sum(survival[b, :w].sum() for b, w in enumerate(plan.windows))
    value = (survival.shape[0] + gain) / float(TABLE.step_seconds(survival.shape[0], plan.budget))
    assert np.isclose(value, plan.objective)
    assert np.isclose(plan.objective, _brute_force(survival, TABLE), rtol=1e-12)


def test_ties_keep_windows_contiguous():
    survival = np.ones((2, 7))
    flat_table = AdditiveCostTable(0.001, [1], [0.0], [1, 100], [0.001, 0.001])
    plan = schedule(survival, flat_table)
    assert plan.windows.tolist() == [7, 7]


def test_budget_per_request_falls_with_batch_size():
    table = default_cost_table()
    rng = np.random.default_rng(0)
    per_request = []
    for bs in (1, 8, 64, 256):
        conf = rng.uniform(0.55, 0.98, size=(bs, 7))
        per_request.append(schedule(np.cumprod(conf, axis=1), table).budget / bs)
    assert all(a >= b for a, b in itertools.pairwise(per_request))
    assert per_request[0] > per_request[-1]


def test_cost_table_interpolates_and_clamps():
    assert np.isclose(TABLE.step_seconds(1, 0), 0.002 + 0.001 + 0.004)
    assert np.isclose(TABLE.step_seconds(4, 8), 0.002 + 0.002 + (0.006 + 0.012) / 2)
    assert np.isclose(TABLE.step_seconds(10, 100), 0.002 + 0.002 + 0.012)


def test_round_to_tier():
    assert round_to_tier(1) == 1
    assert round_to_tier(29) == 32
    assert round_to_tier(256) == 256
    assert round_to_tier(10_000) == 10_000
