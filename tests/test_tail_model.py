"""The tail model of the block-accept walk, on files whose true acceptance law is built in.

Each synthetic workload draws its tokens' draft probabilities and sets every tail token's
acceptance ratio a = min(1, p/q) from a logistic law in log q and offset of its own; the
committed stream follows a tail token with probability p (the target sampled it), so
walks stop early where the target disagrees, as they do in SGLang's file. The truth is
the exact expected ceiling w + sum_m prod_{i<=m} a_i of every block, all positions known.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from dspark_obs.estimator import block_accept_walk, interval
from dspark_obs.estimator.block_accept_walk import (
    model_report,
    summarize_by_workload,
    tail_acceptance_rates,
    tail_model,
    walk_blocks,
)
from dspark_obs.estimator.tail_model import MIN_KNOWN

from dspark_obs.telemetry.block_accept_log import read_block_accept_jsonl

from .conftest import cli

GAMMA = 7
#: name -> (blocks, windows drawn from, logit a = c0 + c_lq log q + c_off offset, q range,
#: share of blocks whose file ends mid-walk[, lift of the first tail position's logit per
#: draft of window: where the scheduler cut long windows, the cut token is easier[, extra
#: slope in log q of the first tail position's logit]])
SPEC = {
    "easy": (3000, [2, 3, 4, 5], (2.5, 1.0, -0.15), (0.3, 1.0), 0.1),
    "hard": (3000, [0, 1, 1, 2], (0.0, 1.5, -0.35), (0.05, 0.9), 0.1),
    "thin": (40, [3, 4], (1.0, 0.5, 0.0), (0.2, 1.0), 0.1),
}


def _world(seed: int, spec: dict = SPEC) -> tuple[list[str], dict]:
    """JSONL lines and, per workload, the true mean ceiling, the walked part of it (the
    products along the walks) and the known positions per offset (all, and those after an
    earlier walked entry of their block: continuation positions), all counted here."""
    rng = np.random.default_rng(seed)
    lines, truth = [], {}
    for name, (n, windows, coef, q_range, open_share, *first) in spec.items():
        lift, first_slope = (*first, 0.0, 0.0)[:2]
        ceilings, walked_part = [], []
        known, continuation = np.zeros(GAMMA, dtype=np.int64), np.zeros(GAMMA, dtype=np.int64)
        for k in range(n):
            w = int(rng.choice(windows))
            m = GAMMA - w
            lq = np.log(rng.uniform(*q_range, m))
            offset = np.arange(w + 1, GAMMA + 1)
            logit = coef[0] + coef[1] * lq + coef[2] * offset
            logit[0] += lift * w + first_slope * lq[0]
            a = 1 / (1 + np.exp(-logit))
            p_lp = np.log(a) + lq
            ceilings.append(w + np.cumprod(a).sum())
            tail = list(range(10, 10 + m))
            reach = m if rng.random() >= open_share else int(rng.integers(1, m + 1))
            pg = []
            for j in range(reach):
                diverge = rng.random() >= math.exp(p_lp[j])
                realized = tail[j] + 1 if diverge else tail[j]
                pg.append([0, w + 1 + j, float(p_lp[j]), tail[j], realized])
                known[w + j] += 1
                continuation[w + j] += j > 0
                if diverge:
                    break
            walked_part.append(np.cumprod(a[: len(pg)]).sum())
            row = {"rid": f"{name}-{k}", "fct": 0, "w": w, "cl": w, "ct": 0,
                   "trimmed_tokens": tail, "q_lp": lq.tolist(), "pg": pg}  # fmt: skip
            lines.append(json.dumps(row))
        truth[name] = {
            "ceiling": float(np.mean(ceilings)),
            "walked": float(np.mean(walked_part)),
            "known": known,
            "continuation": continuation,
        }
    return lines, truth


@pytest.fixture(scope="module")
def world():
    lines, truth = _world(3)
    log = read_block_accept_jsonl(lines)
    model = tail_model(log, GAMMA)
    blocks = walk_blocks(log, GAMMA, model)
    return log, truth, model, blocks, summarize_by_workload(blocks)


def test_point_recovers_each_workloads_law_where_the_pooled_rates_miss(world):
    log, truth, _, blocks, summary = world
    pooled = summarize_by_workload(walk_blocks(log, GAMMA, tail_acceptance_rates(log, GAMMA)[0]))
    for name in ("easy", "hard"):
        t = truth[name]["ceiling"]
        assert summary[name]["mean_point"] == pytest.approx(t, rel=0.005), name
    # the hard workload: windows near one draft, most of every tail never walked
    hard = summary["hard"]
    sel = blocks["workload"] == "hard"
    tails = (GAMMA - blocks["window"][sel]).sum()
    assert blocks["unreached"][sel].sum() > 0.6 * tails and hard["mean_window"] < 1.1
    new_err = abs(hard["mean_point"] / truth["hard"]["ceiling"] - 1)
    old_err = abs(pooled["hard"]["mean_point"] / truth["hard"]["ceiling"] - 1)
    assert old_err > 0.05 and old_err > 10 * new_err
    # the default of walk_blocks is the same model
    np.testing.assert_allclose(walk_blocks(log, GAMMA)["point"], blocks["point"])


def test_the_tails_depth_trend_is_not_the_first_positions_trend_across_windows():
    """First positions whose acceptance rises with the window (the scheduler cut long
    windows at easier tokens) while every tail decays with depth: the first positions'
    offset slope is the selection's, and lent to continuation positions it would lift
    every deep position of a short window. The model keeps the two slopes apart."""
    spec = {"cut": (6000, [0, 1, 2, 3, 4], (0.5, 1.0, -0.3), (0.2, 1.0), 0.0, 0.6)}
    lines, truth = _world(7, spec)
    log = read_block_accept_jsonl(lines)
    model = tail_model(log, GAMMA)
    first, cont = model.coef[0, 3], model.coef[0, 4]  # standardised offset slopes
    assert first > 0 > cont
    summary = summarize_by_workload(walk_blocks(log, GAMMA, model))
    assert summary["cut"]["mean_point"] == pytest.approx(truth["cut"]["ceiling"], rel=0.005)


def test_continuation_rates_take_the_spread_their_held_out_positions_show():
    """Acceptance that rises with log q far more steeply at the first tail position than
    along the tail: the shared log q slope is the first positions' (most known positions),
    so continuation rates come out far too spread. The held-out continuation positions
    show it (a logit slope well below 1); pulled in by that slope, the rates at the
    unreached positions come close to the tail's own law, and the point to the truth."""
    coef = (1.0, 0.3, -0.1)
    spec = {"steep": (6000, [0, 1, 2], coef, (0.2, 1.0), 0.0, 0.0, 2.5)}
    lines, truth = _world(11, spec)
    log = read_block_accept_jsonl(lines)
    model = tail_model(log, GAMMA)
    assert 0.1 < model.spread[0] < 0.5
    unpulled = dataclasses.replace(model, spread=np.ones(1))

    walk = block_accept_walk._walk(log, GAMMA)
    n = log.n_blocks
    rows = np.broadcast_to(np.arange(n)[:, None], (n, GAMMA))
    cols = np.broadcast_to(np.arange(GAMMA)[None, :], (n, GAMMA))
    first, ease = block_accept_walk._first(walk), block_accept_walk._request_ease(log, walk)
    x = block_accept_walk._features_at(walk, first, ease, rows, cols)
    unreached = cols >= (log.block_window + walk.walked.sum(axis=1))[:, None]
    continuation = cols > log.block_window[:, None]
    law = 1 / (1 + np.exp(-(coef[0] + coef[1] * walk.log_q + coef[2] * (cols + 1))))
    group = np.zeros(n, dtype=np.int64)
    miss = [
        np.mean((m.rates(x, group, continuation) - law)[unreached] ** 2) for m in (model, unpulled)
    ]
    assert miss[0] < miss[1] / 5

    t = truth["steep"]["ceiling"]
    err = [
        summarize_by_workload(walk_blocks(log, GAMMA, m))["steep"]["mean_point"] / t - 1
        for m in (model, unpulled)
    ]
    assert abs(err[0]) < 0.01 and abs(err[1]) > 2 * abs(err[0])


def test_one_law_everywhere_leaves_the_spread_near_one(world):
    _, _, model, _, _ = world
    easy, hard = model.names.index("easy"), model.names.index("hard")
    assert 0.8 < model.spread[easy] < 1.25 and 0.8 < model.spread[hard] < 1.25
    assert model.spread[model.names.index("thin")] == pytest.approx(1.0, abs=0.25)


def test_request_ease_is_the_mean_first_position_ratio_of_the_requests_blocks():
    """Three blocks of one request and one of another, by hand: each block's ease is its
    request's mean ratio at the first tail position (a continuation entry does not count;
    a `pg` entry names its block's fct)."""
    rows = [
        {"rid": "r-1", "fct": 0, "w": 1, "q_lp": [math.log(0.5)] * 6,
         "pg": [[0, 2, math.log(0.4), 10, 10], [0, 3, math.log(0.1), 11, 12]]},
        {"rid": "r-1", "fct": 1, "w": 2, "q_lp": [math.log(0.8)] * 5,
         "pg": [[1, 3, math.log(0.8), 10, 11]]},
        {"rid": "r-1", "fct": 2, "w": 6, "q_lp": [0.0], "pg": [[2, 7, math.log(0.3), 10, 11]]},
        {"rid": "s-1", "fct": 0, "w": 0, "q_lp": [0.0] * 7, "pg": [[0, 1, math.log(0.2), 10, 11]]},
    ]  # fmt: skip
    for r in rows:
        n = GAMMA - r["w"]
        r.update(cl=r["w"], ct=0, trimmed_tokens=list(range(10, 10 + n)))
    log = read_block_accept_jsonl([json.dumps(r) for r in rows])
    walk = block_accept_walk._walk(log, GAMMA)
    ease = block_accept_walk._request_ease(log, walk)
    # ratios at first positions: 0.4 / 0.5, 0.8 / 0.8, 0.3 / 1; the other request's 0.2
    r_ease = (0.8 + 1.0 + 0.3) / 3
    order = np.argsort(log.block_fct + 10 * (log.block_rid == "s-1"))
    np.testing.assert_allclose(ease[order], [r_ease, r_ease, r_ease, 0.2], rtol=1e-12)


def test_parts_sum_to_the_point_and_the_walked_part_is_the_walks_products(world):
    _, truth, _, blocks, summary = world
    for name, s in summary.items():
        parts = s["parts"]
        assert sum(parts.values()) == pytest.approx(s["mean_point"], rel=1e-12)
        assert sum(s["shares"].values()) == pytest.approx(1.0, rel=1e-12)
        sel = blocks["workload"] == name
        assert parts["observed"] == pytest.approx(blocks["window"][sel].mean())
        assert parts["walked"] == pytest.approx(truth[name]["walked"], rel=1e-9)
        assert 0 <= s["unidentified"] <= parts["extrapolated"] + 1e-12
        assert s["mean_lo"] <= s["mean_point_lo"] <= s["mean_point"] <= s["mean_point_hi"]
        assert s["mean_point_hi"] <= s["mean_hi"] + 1e-12


def test_calibration_holds_on_held_out_positions(world):
    _, truth, model, _, _ = world
    report = model_report(model)
    for name in ("easy", "hard"):
        cal = report[name]["calibration"]
        assert cal["calibrated"] is True, (name, cal)
        assert cal["held_out"] == truth[name]["known"].sum()
        assert abs(cal["mean_predicted"] - cal["mean_observed"]) < 0.01
        assert cal["ece"] < 0.01
        assert sum(b["count"] for b in cal["bins"]) == cal["held_out"]


def test_the_check_fails_a_model_that_does_not_fit():
    """Acceptance that swings with the parity of the offset: no law smooth in offset fits
    it, and the held-out check must say so."""
    spec = {"zigzag": (3000, [0], (0.0, 0.0, 0.0), (0.5, 1.0), 0.0)}
    lines, _ = _world(5, spec)
    rows = [json.loads(x) for x in lines]
    for row in rows:
        for e in row["pg"]:  # a = 0.95 at odd offsets, 0.3 at even ones: p = a q
            lq = row["q_lp"][e[1] - 1]
            e[2] = math.log(0.95 if e[1] % 2 else 0.3) + lq
    log = read_block_accept_jsonl([json.dumps(r) for r in rows])
    cal = model_report(tail_model(log, GAMMA))["zigzag"]["calibration"]
    assert cal["calibrated"] is False


def test_unidentified_cells_are_flagged_and_widened(world):
    _, truth, model, blocks, summary = world
    report = model_report(model)
    for name in SPEC:
        known = truth[name]["known"]
        assert report[name]["known_positions"] == known.tolist()
        continuation = truth[name]["continuation"]
        assert report[name]["continuation_positions"] == continuation.tolist()
        # unreached positions are all continuation positions: only those identify them
        assert report[name]["identified"] == (continuation >= MIN_KNOWN).tolist()
    # the hard workload (windows near one draft) has first positions enough at offsets
    # whose continuation positions are too few: a count of all known positions would
    # call those offsets identified
    hard = truth["hard"]
    assert ((hard["known"] >= MIN_KNOWN) & (hard["continuation"] < MIN_KNOWN)).any()
    # the thin workload (40 blocks) identifies few offsets: where every unreached position
    # of a block is unidentified, its point range is the whole lo/hi bracket
    ident = np.asarray(report["thin"]["identified"])
    assert not ident.all()
    sel = np.flatnonzero(blocks["workload"] == "thin")
    start = blocks["window"][sel] + blocks["walked"][sel]
    blind = sel[[not ident[s:].any() and s < GAMMA for s in start.tolist()]]
    assert len(blind) > 0
    np.testing.assert_allclose(blocks["point_lo"][blind], blocks["lo"][blind])
    np.testing.assert_allclose(blocks["point_hi"][blind], blocks["hi"][blind])
    np.testing.assert_allclose(
        blocks["unidentified"][blind], blocks["point"][blind] - blocks["lo"][blind]
    )
    assert summary["thin"]["unidentified"] > 0


def test_position_terms_by_hand():
    rates = np.array([[0.5, 0.5, 0.4, 0.9], [0.1, 0.2, 0.3, 0.4]])
    terms = interval.position_terms(rates, np.array([1, 4]))
    np.testing.assert_allclose(terms, [[0, 0.5, 0.2, 0.18], [0, 0, 0, 0]])
    # the same sum as per-position rates shared by every block
    shared = interval.rate_extrapolation(rates[0])(np.zeros(1, int), np.array([1]), None)
    assert terms[0].sum() == pytest.approx(shared[0])


def test_cli_text_and_json_say_what_the_point_is_made_of(tmp_path):
    lines, _ = _world(4, {k: SPEC[k] for k in ("hard", "thin")})
    path = tmp_path / "ba.jsonl"
    path.write_text("\n".join(lines) + "\n")
    args = ("estimate", "--sglang-jsonl", str(path), "--gamma", str(GAMMA))
    report = json.loads(cli(*args, "--json").stdout)
    for name in ("hard", "thin"):
        e = report["workloads"][name]
        steps = e["sampled"]["all_steps"]
        assert sum(steps["parts"].values()) == pytest.approx(steps["mean_point"], rel=1e-12)
        assert len(e["tail_model"]["identified"]) == GAMMA
    text = cli(*args).stdout
    assert "hard" in text and "thin" in text and "extrap." in text and "calibrated" in text


def test_position_terms_take_sets_of_rates_and_extra_parts_agrees_by_hand():
    """Leading axes of `position_terms` are independent sets; `extra_parts`'s four sums
    against the per-block arithmetic (rates within the margin where identified, anywhere
    in [0, 1] elsewhere)."""
    rng = np.random.default_rng(3)
    rates = rng.uniform(0.0, 1.0, (2, 5, 4))
    start = np.array([0, 1, 2, 4, 3])
    stacked = interval.position_terms(rates, start)
    for i in range(2):
        np.testing.assert_array_equal(stacked[i], interval.position_terms(rates[i], start))
    ident = rng.uniform(size=(5, 4)) < 0.5
    margin = np.array([0.1, 0.0, 0.3, 0.2, 0.05])
    parts = interval.extra_parts(rates[0], ident, margin, start)
    for b in range(5):

        def expected(r, b=b):
            total, run = 0.0, 1.0
            for j in range(start[b], 4):
                run *= r[j]
                total += run
            return total

        r = rates[0, b]
        low = np.where(ident[b], np.clip(r - margin[b], 0, 1), 0.0)
        high = np.where(ident[b], np.clip(r + margin[b], 0, 1), 1.0)
        run = np.cumprod(np.where(np.arange(4) >= start[b], r, 1.0))
        silent = sum(run[j] for j in range(start[b], 4) if not ident[b, j])
        want = [expected(r), expected(low), expected(high), silent]
        np.testing.assert_allclose(parts[:, b], want, rtol=1e-12, atol=1e-15)


def test_window_rows_mark_each_window():
    rows = interval.window_rows(4)
    for w in range(5):
        assert rows[w].tolist() == [j < w for j in range(4)]
