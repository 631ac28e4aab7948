"""The estimator's compiled batch kernels (`_tailwalk.c`) against their numpy forms.

Every caller of `compiled.KERNELS` keeps a numpy form, the reference; the kernels claim
its numbers to the last bit. Here each caller runs twice on the same input, once with
the kernels and once with `compiled.KERNELS` set to None (what `DSPARK_OBS_NO_EXTENSIONS`
does at import), and every number must be bitwise equal: the whole estimator on runtime
traffic, then each model on generated steps with the awkward values (no confidence,
NaN confidence and log-probabilities, confidence 0 and 1, empty steps, greedy rows).
The kernels must also refuse malformed arguments with an exception, never a crash.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from dspark_obs.estimator import compiled, extrapolation_check, interval, population, tails
from dspark_obs.estimator.ceiling_estimator import CeilingEstimator
from dspark_obs.estimator.extrapolation_check import CheckedExtrapolation, ExtrapolationCheck
from dspark_obs.estimator.population import HazardModel, QueuedStep
from dspark_obs.estimator.tails import _FIELDS as FIELDS
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime

KERNELS = compiled.KERNELS
pytestmark = pytest.mark.skipif(
    KERNELS is None, reason="the C kernels are not built or DSPARK_OBS_NO_EXTENSIONS is set"
)
GAMMA = 7


def assert_bitwise(have, want, path="") -> None:
    """Equal to the last bit (NaN where NaN), through dicts, lists and tuples."""
    if isinstance(want, dict):
        assert set(have) == set(want), path
        for k in want:
            assert_bitwise(have[k], want[k], f"{path}.{k}")
    elif isinstance(want, list | tuple):
        assert len(have) == len(want), path
        for i, (h, w) in enumerate(zip(have, want, strict=True)):
            assert_bitwise(h, w, f"{path}[{i}]")
    elif want is None:
        assert have is None, path
    else:
        h, w = np.asarray(have), np.asarray(want)
        assert h.shape == w.shape and h.dtype == w.dtype, (path, h.shape, w.shape)
        if w.dtype.kind == "f":
            # the same bits, so -0.0 against 0.0 or two NaN payloads would show too
            bits = [np.ascontiguousarray(x).reshape(-1).view(np.uint8) for x in (h, w)]
            assert np.array_equal(*bits), (path, h, w)
        else:
            assert np.array_equal(h, w), path


def without_kernels(monkeypatch, fn):
    """`fn()` with the numpy forms, as an install without the extension runs it."""
    with monkeypatch.context() as m:
        m.setattr(compiled, "KERNELS", None)
        return fn()


# -- the whole estimator ------------------------------------------------------------


def estimator_outputs(config: RuntimeConfig, steps: list) -> dict:
    est = CeilingEstimator(
        config.gamma,
        step_cost=lambda mode, rank: config.cost_table,
        capture_tiers=tuple(config.capture_tiers),
    )
    snaps, tables = [], []
    for i, (batch, p) in enumerate(steps):
        est.update(batch, lambda r, j, t, p=p: np.log(p[r, j, t]))
        if i % 41 == 40:  # snapshots mid-run teach the models early, as a scrape does
            snaps.append(est.snapshot())
            tables.append(est.take_rows())
    est.close()
    snaps.append(est.snapshot())
    tables.append(est.take_rows())
    pop, check = est.population, est.check
    return {
        "snapshots": [(s.total, s.window, s.pending, s.survival, s.identifiable) for s in snaps],
        "tables": [None if t is None else t.to_dict(as_series=False) for t in tables],
        "population": [getattr(pop, k) for k in ("_n0", "_d0", "_n", "_d", "_ccnt", "_csum")],
        "reservoir": [pop._ring, pop._head, pop._fill],
        "check": [check.sums, check.blend_moments],
        "smooth": [check.smooth._sums, check.smooth._coef, check.smooth._mean],
        "calibration": [check.calibration(g) for g in range(len(est.index.groups))],
    }


@pytest.mark.parametrize(
    ("mode", "concurrency", "steps"), [("compact", [256], 140), ("cap-accept", [16, 64], 120)]
)
def test_the_estimator_gives_the_same_numbers_with_and_without_kernels(
    monkeypatch, mode, concurrency, steps
):
    config = RuntimeConfig(mode=mode, concurrency=concurrency, steps_per_level=steps, seed=3)
    runtime = DSparkRuntime(config)
    # the runtime reuses its verify table each step
    traffic = [(batch, runtime._verified.copy()) for batch in runtime.run()]
    have = estimator_outputs(config, traffic)
    want = without_kernels(monkeypatch, lambda: estimator_outputs(config, traffic))
    assert sum(len(t["rid"]) for t in want["tables"] if t) > 1000
    assert want["check"][0].sum() > 0  # the held-out check ran
    assert_bitwise(have, want)


# -- each model on generated steps ----------------------------------------------------


def queued_steps(seed: int, n_steps: int, groups: int) -> list[QueuedStep]:
    """Steps with the values the kernels must treat as numpy does: steps without
    confidence or log-probabilities, NaN in both, confidence at 0 and 1 (bin edges),
    -inf log-probabilities, greedy rows, empty steps."""
    rng = np.random.default_rng(seed)
    steps = []
    for s in range(n_steps):
        n = int(rng.choice([0, 1, 5, 40]))
        w = rng.integers(0, GAMMA + 1, n)
        a = (rng.random(n) * (w + 1)).astype(np.int64)
        conf = None
        if rng.random() < 0.8:
            conf = rng.random((n, GAMMA))
            pick = rng.random((n, GAMMA))
            conf[pick < 0.1] = np.nan
            conf[(pick >= 0.1) & (pick < 0.15)] = 0.0
            conf[(pick >= 0.15) & (pick < 0.2)] = 1.0
            conf[(pick >= 0.2) & (pick < 0.25)] = np.round(conf[(pick >= 0.2) & (pick < 0.25)], 1)
        tlp = dlp = None
        if rng.random() < 0.8:
            tlp, dlp = rng.uniform(-6.0, 0.0, (2, n, GAMMA))
            tlp[rng.random((n, GAMMA)) < 0.05] = np.nan
            dlp[rng.random((n, GAMMA)) < 0.05] = -np.inf
        steps.append(
            QueuedStep(
                rng.integers(0, groups, n),
                w,
                a,
                conf,
                (rng.random(n) < 0.3).astype(np.int8),
                tlp,
                dlp,
                # forward_ct values of which some are checked steps (`checked_steps`)
                int(rng.integers(0, 1 << 20)) if s % 3 else int(s),
            )
        )
    return steps


def taught(seed: int, groups: int) -> tuple[HazardModel, ExtrapolationCheck]:
    """A model and check that have learnt some steps (through the numpy forms)."""
    model, check = HazardModel(GAMMA), ExtrapolationCheck(GAMMA)
    saved, compiled.KERNELS = compiled.KERNELS, None
    try:
        for _ in range(2):
            steps = queued_steps(seed, 30, groups)
            check.observe_steps(model, steps)
            model.update_steps(steps)
    finally:
        compiled.KERNELS = saved
    return model, check


SEEDS = st.integers(0, 2**32 - 1)


@settings(max_examples=40, deadline=None)
@given(
    seed=SEEDS,
    n_steps=st.integers(1, 12),
    groups=st.integers(1, 4),
    chunk=st.sampled_from([population.UPDATE_CHUNK, 1, 7, 50]),
)
def test_population_update_steps_is_the_numpy_update(seed, n_steps, groups, chunk):
    """Also with chunks of a few rows, whose ends fall inside steps and between them."""
    steps = queued_steps(seed + 1, n_steps, groups)
    model, _ = taught(seed, 2)
    fast, slow = model, copy.deepcopy(model)
    saved_chunk, population.UPDATE_CHUNK = population.UPDATE_CHUNK, chunk
    try:
        fast.update_steps(steps)
        saved, compiled.KERNELS = compiled.KERNELS, None
        try:
            slow.update_steps(steps)
        finally:
            compiled.KERNELS = saved
    finally:
        population.UPDATE_CHUNK = saved_chunk
    state = ("_n0", "_d0", "_n", "_d", "_ccnt", "_csum", "_ring", "_head", "_fill")
    assert_bitwise([getattr(fast, k) for k in state], [getattr(slow, k) for k in state])


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, n_steps=st.integers(1, 12), groups=st.integers(1, 4))
def test_the_check_and_smooth_model_observe_steps_as_numpy_does(seed, n_steps, groups):
    steps = queued_steps(seed + 1, n_steps, groups)
    model, check = taught(seed, 2)
    fast, slow = (check, model), copy.deepcopy((check, model))
    fast[0].observe_steps(fast[1], steps)
    saved, compiled.KERNELS = compiled.KERNELS, None
    try:
        slow[0].observe_steps(slow[1], steps)
    finally:
        compiled.KERNELS = saved

    def state(c: ExtrapolationCheck) -> list:
        s = c.smooth
        return [c.sums, c.blend_moments, s._sums, s._coef, s._mean, s._scale, s._fitted_on]

    assert_bitwise(state(fast[0]), state(slow[0]))


@settings(max_examples=40, deadline=None)
@given(seed=SEEDS, k=st.integers(0, 300), groups=st.integers(1, 5))
def test_acceptance_and_extrapolated_parts_are_the_numpy_ones(seed, k, groups):
    model, check = taught(seed, 3)
    rng = np.random.default_rng(seed)
    grp = rng.integers(0, groups, k)  # groups the model never saw are grown, as numpy does
    start = rng.integers(0, GAMMA + 1, k)
    for conf in (None, queued_steps(seed, 1, 1)[0].confidence, rng.random((k, GAMMA))):
        if conf is not None and conf.shape != (k, GAMMA):
            conf = np.where(rng.random((k, GAMMA)) < 0.1, np.nan, rng.random((k, GAMMA)))
        extrapolation = CheckedExtrapolation(model, check)
        have = (model.acceptance(grp, conf), extrapolation.parts(grp, start, conf))
        saved, compiled.KERNELS = compiled.KERNELS, None
        try:
            want = (model.acceptance(grp, conf), extrapolation.parts(grp, start, conf))
        finally:
            compiled.KERNELS = saved
        assert_bitwise(have, want)


def test_known_ratios_are_numpys_exp_of_every_log_ratio():
    """The kernel writes a log ratio of 0 as its ratio 1 and leaves the negative ones to
    numpy's exp: the ratios are `known_ratios`' (exp of every clipped log ratio) to the
    last bit, at p > q, p == q, -0.0, a -inf target (ratio 0) and a -inf draft."""
    values = np.array([0.0, -0.0, -1e-300, -0.5, -3.0, -np.inf, np.nan, -745.2, -2.0])
    rng = np.random.default_rng(7)
    n = 200
    tlp, dlp = rng.choice(values, (2, n, GAMMA))
    w = rng.integers(0, GAMMA + 1, n)
    greedy = (rng.random(n) < 0.2).astype(np.int8)
    group = np.zeros(n, np.int64)
    step = QueuedStep(group, w, np.zeros(n, np.int64), None, greedy, tlp, dlp, 0)
    ratios, offsets, logs, where = KERNELS.known_log_ratios([step, step], GAMMA)
    ratios.put(logs, np.exp(ratios.take(logs)))
    known, want = extrapolation_check.known_ratios(w, greedy, tlp, dlp, GAMMA)
    assert known.sum() > 300 and (want[known] == 1).sum() > 100 and (want[known] == 0).any()
    assert offsets.tolist() == [0, known.sum(), 2 * known.sum()]
    row, position = np.nonzero(known)
    assert where.tolist() == 2 * (row * 64 + position).tolist()
    assert_bitwise(ratios, np.concatenate([want[known], want[known]]))


@settings(max_examples=30, deadline=None)
@given(seed=SEEDS, k=st.integers(1, 300), groups=st.integers(1, 4))
def test_the_blend_from_each_blocks_start_gives_the_same_bits(seed, k, groups):
    """The walks' extrapolation asks the check for the blend only from each block's start
    on (`ExtrapolationCheck.rates(..., start)`): those cells are the blend of every cell
    bit for bit, the earlier ones keep the population model's rate, and the point, its
    range and the unidentified part are the same bits as from the blend of every cell,
    with the kernels and without."""
    model, check = taught(seed, groups)
    rng = np.random.default_rng(seed)
    grp = rng.integers(0, groups, k)
    conf = np.where(rng.random((k, GAMMA)) < 0.1, np.nan, rng.random((k, GAMMA)))
    start = rng.integers(0, GAMMA, k)
    full, ident = check.rates(model, grp, conf)
    part, ident_part = check.rates(model, grp, conf, start)
    model_rates = model.acceptance(grp, conf)[0]
    later = np.arange(GAMMA)[None, :] >= start[:, None]
    assert_bitwise((ident_part, part[later]), (ident, full[later]))
    assert_bitwise(part[~later], model_rates[~later])
    # the compiled rates from the start on: those cells the same, the earlier ones unread
    rates, identified = model.acceptance(grp, conf, start)
    assert_bitwise((rates[later], identified[later]), (model_rates[later], ident[later]))
    assert np.isnan(rates[~later]).all() and not identified[~later].any()
    margin = check.margin(grp)
    want = interval.extra_parts(full, ident, margin, start)
    extrapolation = CheckedExtrapolation(model, check)
    assert_bitwise(extrapolation.parts(grp, start, conf), want)
    saved, compiled.KERNELS = compiled.KERNELS, None
    try:
        assert_bitwise(extrapolation.parts(grp, start, conf), want)
    finally:
        compiled.KERNELS = saved
    assert_bitwise(
        extrapolation(grp, start, conf), interval.position_terms(full, start).sum(axis=1)
    )


@settings(max_examples=60, deadline=None)
@given(seed=SEEDS, k=st.integers(0, 200))
def test_block_ceilings_are_the_numpy_ceilings(seed, k):
    rng = np.random.default_rng(seed)
    f = np.zeros((k, FIELDS))
    window = rng.integers(0, GAMMA + 1, k)
    reached = np.minimum(window + rng.integers(0, GAMMA + 1, k), GAMMA)
    greedy = rng.random(k) < 0.4
    f[:, tails.WINDOW], f[:, tails.NEXT], f[:, tails.GREEDY] = window, reached, greedy
    f[:, tails.CUM] = rng.choice([0.0, 1.0, 0.3, np.nan], k) * rng.random(k)
    f[:, tails.LO_EXTRA] = rng.random(k) * (reached - window)
    f[:, tails.VAR_TERMS] = rng.random(k) * (reached - window) ** 2
    unreached = GAMMA - reached
    extra, extra_lo, extra_hi, unidentified = rng.uniform(-1.0, GAMMA + 1.0, (4, k))
    extra[rng.random(k) < 0.1] = np.nan
    extra_hi[rng.random(k) < 0.1] = np.inf
    have = KERNELS.block_ceilings(f, extra, extra_lo, extra_hi, unidentified, unreached)
    want = tails._ceilings(
        f, window, greedy, reached, unreached, extra, extra_lo, extra_hi, unidentified
    )
    names = ("lo", "point", "hi", "var", "point_lo", "point_hi", "unidentified", "var_hi")
    assert_bitwise(dict(zip(names, have, strict=True)), want)


# -- bad calls ------------------------------------------------------------------------


def good_steps() -> list[QueuedStep]:
    return queued_steps(7, 4, 2)


def bad_step_lists() -> list:
    """(steps, the kernels that read what is wrong in them: all of them by default)."""
    step = good_steps()[-1]
    n = len(step.group)
    every = range(5)
    return [
        (None, every),
        ((step,), every),  # a tuple of steps, not a list
        ([None], every),
        ([tuple(step)[:3]], every),  # too few columns
        ([step._replace(group="x")], every),
        ([step._replace(window=np.zeros(n + 1, np.int64))], every),  # rows disagree
        # not gamma wide: the kernels that read the confidence
        ([step._replace(confidence=np.zeros((n, GAMMA + 1)))], (0, 2, 3, 4)),
        # 1-D where 2-D: the kernels that read the log-probabilities
        ([step._replace(target_logprobs=np.zeros(n))], (1, 3, 4)),
    ]


@pytest.mark.parametrize(("steps", "readers"), bad_step_lists())
def test_the_step_kernels_refuse_malformed_steps(steps, readers):
    model = HazardModel(GAMMA)
    model.ensure_groups(2)
    hazard, data = model.tables()
    state = (model._ring, model._head, model._fill)
    calls = [
        lambda: KERNELS.validate_steps(steps, GAMMA),
        lambda: KERNELS.known_log_ratios(steps, GAMMA),
        lambda: KERNELS.count_blocks(steps, model.bins, 1024, *model._state(), *state),
        lambda: KERNELS.smooth_sums(
            steps, np.zeros(0), np.zeros(1, np.int64), np.zeros(0, np.int64), 2, GAMMA, 64
        ),
        lambda: KERNELS.check_sums(
            steps,
            np.ones(1, bool),
            np.zeros(0),
            np.zeros(2, np.int64),
            hazard,
            data,
            model.at_risk(),
            10,
        ),
    ]
    for i in readers:
        with pytest.raises((TypeError, ValueError)):
            calls[i]()


def test_the_kernels_refuse_rows_and_arrays_outside_their_bounds():
    steps = good_steps()
    model = HazardModel(GAMMA)
    model.ensure_groups(1)  # the steps have group 1 too
    hazard, data = model.tables()
    reservoir = (model._ring, model._head, model._fill)
    ratios, offsets, _, where = KERNELS.known_log_ratios(steps, GAMMA)
    with pytest.raises(ValueError, match="group"):
        KERNELS.count_blocks(steps, model.bins, 1024, *model._state(), *reservoir)
    with pytest.raises(ValueError):
        KERNELS.count_blocks(steps, 0, 1024, *model._state(), *reservoir)
    model.ensure_groups(2)
    hazard, data = model.tables()
    reservoir = (model._ring, model._head, model._fill)
    wrong = [x.astype(np.float64) for x in model._state()]
    with pytest.raises(ValueError):
        KERNELS.count_blocks(steps, model.bins, 1024, *wrong, *reservoir)
    model._head[0] = -1
    with pytest.raises(ValueError, match="reservoir"):
        KERNELS.count_blocks(steps, model.bins, 1024, *model._state(), *reservoir)
    model._head[0] = 0
    for bad in (
        [steps[0]._replace(accepted=steps[0].window + 1)],
        [steps[0]._replace(window=np.full(len(steps[0].group), GAMMA + 1))],
        [steps[0]._replace(group=-1 - steps[0].group)],
    ):
        with pytest.raises(ValueError):
            KERNELS.validate_steps(bad, GAMMA)
        with pytest.raises(ValueError):
            KERNELS.count_blocks(bad, model.bins, 1024, *model._state(), *reservoir)
    bad_conf = steps[0]._replace(confidence=np.full((len(steps[0].group), GAMMA), 1.5))
    with pytest.raises(ValueError, match="confidence"):
        KERNELS.validate_steps([bad_conf], GAMMA)
    checked = np.ones(len(steps), bool)
    # offsets that point past the ratios, or run backwards
    for bad_offsets in (offsets + len(ratios) + 1, offsets[::-1].copy(), offsets[:-1]):
        with pytest.raises(ValueError):
            KERNELS.check_sums(
                steps, checked, ratios, bad_offsets, hazard, data, model.at_risk(), 10
            )
        with pytest.raises(ValueError):
            KERNELS.smooth_sums(steps, ratios, bad_offsets, where, 2, GAMMA, 64)
    with pytest.raises(ValueError):
        KERNELS.check_sums(steps, checked[:-1], ratios, offsets, hazard, data, model.at_risk(), 10)
    with pytest.raises(ValueError):  # tables of a model with fewer groups than the steps
        small = HazardModel(GAMMA)
        KERNELS.check_sums(steps, checked, ratios, offsets, *small.tables(), small.at_risk(), 10)
    with pytest.raises(ValueError):
        KERNELS.smooth_sums(steps, ratios, offsets, where, 1, GAMMA, 64)  # too few groups
    for bad in (where[:-1], where + 64 * 1000, where | 63, -where - 1):  # not the positions
        with pytest.raises(ValueError):
            KERNELS.smooth_sums(steps, ratios, offsets, bad, 2, GAMMA, 64)
    grp = np.array([0, 5])
    with pytest.raises(ValueError):
        KERNELS.cell_rates(hazard, data, grp, None)  # group 5 outside the tables
    with pytest.raises(ValueError):
        KERNELS.cell_rates(hazard, data, np.array([0, 1]), np.zeros((3, GAMMA)))
    with pytest.raises(ValueError):
        KERNELS.cell_rates(hazard[..., :-1], data, np.array([0, 1]), None)
    rates, ident = np.full((GAMMA, 3), 0.5), np.ones((GAMMA, 3), bool)
    for bad in (
        (rates, ident[:, :2], np.zeros(3), np.zeros(3, np.int64)),
        (rates, ident, np.zeros(2), np.zeros(3, np.int64)),
        (rates[0], ident, np.zeros(3), np.zeros(3, np.int64)),
    ):
        with pytest.raises((TypeError, ValueError)):
            KERNELS.extra_parts(*bad)
    conf = np.full((3, GAMMA), 0.5)
    for bad in (
        (ident, conf[:2], np.zeros(3, np.int64)),
        (ident, conf.T, np.zeros(3, np.int64)),  # not the blocks' row-major layout
        (ident, conf, np.zeros(3)),
        (ident[0], conf, np.zeros(3, np.int64)),
    ):
        with pytest.raises((TypeError, ValueError)):
            KERNELS.blend_cells(*bad)
    f = np.zeros((3, FIELDS))
    with pytest.raises(ValueError):
        KERNELS.block_ceilings(f, *np.zeros((4, 2)), np.zeros(3, np.int64))
    with pytest.raises(ValueError):
        KERNELS.block_ceilings(f[:, :-1], *np.zeros((4, 3)), np.zeros(3, np.int64))
    for counts in (None, [None], [(np.zeros(2, np.int64),) * 3], [(np.array([0, 9]),) * 5]):
        with pytest.raises((TypeError, ValueError)):
            KERNELS.count_rows(counts, GAMMA, 2)
