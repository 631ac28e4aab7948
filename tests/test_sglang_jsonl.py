"""SGLang's block-accept estimator JSONL: parsing, the sampled walk, and its aggregates.

The tiny files are written here line by line so every number can be checked by
hand; the sample file is SGLang 0.5.23's exact output for the trajectory whose
`/server_info` dump sits next to it, so the two must agree row for row.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from dspark_obs.estimator import interval
from dspark_obs.estimator.block_accept_walk import (
    summarize_by_workload,
    tail_acceptance_rates,
    walk_blocks,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_obs.telemetry.block_accept_log import default_workload_of, read_block_accept_jsonl

from .interval_reference import reference_interval

SAMPLES = Path(__file__).parent / "data" / "sglang"
SAMPLE_JSONL = SAMPLES / "block_accept.sampled.jsonl"
SAMPLE_DUMP = SAMPLES / "server_info.compact.sampled.json"
LN = math.log


def _row(rid, fct, w, cl, ct=0, tail=None, q=None, pg=None) -> str:
    obj = {"rid": rid, "fct": fct, "w": w, "cl": cl, "ct": ct}
    if tail is not None:
        obj["trimmed_tokens"] = tail
        obj["q_lp"] = [LN(x) for x in q]
    if pg is not None:
        obj["pg"] = pg
    return json.dumps(obj)


# gamma 4. A diverges at its 2nd offset, B is exhausted, C ends at eos, D is left open.
HAND = [
    _row("wa-0", 10, 1, 1, tail=[5, 6, 7], q=[0.5] * 3, pg=[[10, 2, LN(0.25), 5, 5]]),
    _row("wa-1", 10, 2, 2, tail=[1, 2], q=[0.8, 0.5], pg=[[10, 3, LN(0.4), 1, 1]]),
    _row("wb-0", 11, 1, 1, tail=[3, 4, 5], q=[0.5] * 3, pg=[[11, 2, LN(0.3), 3, 3]]),
    _row("wb-1", 11, 0, 0, tail=[7, 8, 9, 10], q=[0.5] * 4, pg=[[11, 1, LN(0.4), 7, 7]]),
    _row("wa-0", 11, 2, 0, pg=[[10, 3, 0.0, 6, 9]]),
    _row("wa-1", 11, 3, 2, pg=[[10, 4, LN(0.25), 2, 2]]),
    json.dumps({"rid": "wb-0", "eos_end": [11]}),
    _row("wb-1", 12, 2, 1, pg=[[11, 2, LN(0.9), 8, 8]]),
]


def _by_key(blocks: dict) -> dict:
    return {
        (r, int(f)): {k: v[i] for k, v in blocks.items()}
        for i, (r, f) in enumerate(zip(blocks["rid"], blocks["block_fct"], strict=True))
    }


def test_hand_blocks_bounds_point_and_variance():
    log = read_block_accept_jsonl(HAND)
    assert log.bad_lines == 0 and log.n_blocks == 4 and log.n_rows == 7 and log.n_markers == 1
    # the file's pooled per-offset rates, so the point can be checked by hand (the default,
    # the tail model, is checked in tests/test_tail_model.py)
    blocks = walk_blocks(log, 4, tail_acceptance_rates(log, 4)[0])
    got = _by_key(blocks)
    a, b, c, d = got["wa-0", 10], got["wa-1", 10], got["wb-0", 11], got["wb-1", 11]

    # A: a = .5 then 1 (diverges at offset 3): P = .5, .5; the offset-4 position unreached.
    assert a["status"] == "resolved" and a["walked"] == 2
    assert a["lo"] == pytest.approx(1 + 0.5 + 0.5)
    assert a["hi"] == pytest.approx(2 + 0.5 * (4 - 3))
    assert a["var"] == pytest.approx(1 * 0.5 + 3 * 0.5 - 1.0**2)
    # were offset 4 accepted, N would be 0 or 3 (each with chance .5)
    assert a["var_hi"] == pytest.approx(0.5 * 1.5**2 * 2)
    # B: a = .5, .5 up to offset gamma: P = .5, .25, exact.
    assert b["status"] == "resolved" and b["unreached"] == 0
    assert b["lo"] == pytest.approx(2.75) and b["hi"] == pytest.approx(2.75)
    assert b["point"] == pytest.approx(2.75)
    assert b["var"] == pytest.approx(0.5 + 3 * 0.25 - 0.75**2)
    assert b["var_hi"] == pytest.approx(b["var"])
    # C: a = .6, then the request stopped naturally: lo == hi == point.
    assert c["status"] == "eos"
    assert c["lo"] == c["hi"] == c["point"] == pytest.approx(1.6)
    assert c["var"] == pytest.approx(0.6 - 0.36)
    assert c["var_hi"] == pytest.approx(c["var"])
    # D: a = .8, 1 then the file ends: positions 3 and 4 unreached.
    assert d["status"] == "open" and d["unreached"] == 2
    assert d["lo"] == pytest.approx(1.6) and d["hi"] == pytest.approx(1.6 + 0.8 * 2)
    assert d["var"] == pytest.approx(0.8 + 3 * 0.8 - 1.6**2)
    # were offsets 3 and 4 accepted, N would be 0 (chance .2) or 4 (chance .8)
    assert d["var_hi"] == pytest.approx(16 * 0.8 * 0.2)

    # Pooled rates: mean walked a per offset = [.8, (.5+.6+1)/3, (1+.5)/2, .5].
    rates, counts = tail_acceptance_rates(log, 4)
    np.testing.assert_allclose(rates, [0.8, 0.7, 0.75, 0.5])
    np.testing.assert_array_equal(counts, [1, 3, 2, 1])
    e4 = 0.5
    e3 = 0.75 * (1 + e4)
    assert a["point"] == pytest.approx(2 + 0.5 * e4)
    assert d["point"] == pytest.approx(1.6 + 0.8 * e3)

    summary = summarize_by_workload(blocks, log=log)
    wa, wb = summary["wa"], summary["wb"]
    assert (wa["blocks"], wa["resolved"], wa["eos"], wa["open"]) == (2, 2, 0, 0)
    assert (wb["blocks"], wb["resolved"], wb["eos"], wb["open"]) == (2, 0, 1, 1)
    assert wa["mean_lo"] == pytest.approx((2 + 2.75) / 2)
    assert wa["mean_hi"] == pytest.approx((2.5 + 2.75) / 2)
    assert wa["mean_point"] == pytest.approx((2.25 + 2.75) / 2)
    se = math.sqrt(1.0 + 0.6875) / 2
    assert wa["se"] == pytest.approx(se)
    # the upper end: the spread of the outcome with every unreached position accepted
    se_hi = math.sqrt(2.25 + 0.6875) / 2
    assert wa["se_hi"] == pytest.approx(se_hi)
    # both blocks could reach gamma 4 at most, and never fall below their windows 1 and 2
    want = reference_interval([2, 2.75], [2.5, 2.75], [1.0, 0.6875], [2.25, 0.6875], [1, 2], [4, 4])
    assert (wa["ci_lo"], wa["ci_hi"]) == pytest.approx(want, rel=1e-9)
    # All steps: wa adds the exact rows (cl + ct) 0 and 2; wb adds 1.
    steps = wa["all_steps"]
    assert (steps["steps"], steps["exact_steps"]) == (4, 2)
    assert steps["mean_lo"] == pytest.approx((2 + 2.75 + 0 + 2) / 4)
    assert steps["mean_hi"] == pytest.approx((2.5 + 2.75 + 0 + 2) / 4)
    assert steps["se"] == pytest.approx(math.sqrt(1.6875) / 4)
    assert summary["wb"]["all_steps"]["mean_lo"] == pytest.approx((1.6 + 1.6 + 1) / 3)


def test_sglang_units_are_one_more_than_accepted_drafts():
    """SGLang's _finalize_walk_online: lo = w + 1 + lo_extra (accept length)."""
    blocks = walk_blocks(read_block_accept_jsonl(HAND), 4)
    a = _by_key(blocks)["wa-0", 10]
    sglang_lo, sglang_hi = 1 + 1.0 + (0.5 + 0.5), 1 + 1.0 + 1.0 + 0.5 * (4 - 3)
    assert a["lo"] + 1 == pytest.approx(sglang_lo)
    assert a["hi"] + 1 == pytest.approx(sglang_hi)


def test_caller_extrapolation_rates_and_callable():
    log = read_block_accept_jsonl(HAND)
    ones = walk_blocks(log, 4, np.ones(4))
    np.testing.assert_allclose(ones["point"], ones["hi"])
    zeros = walk_blocks(log, 4, np.zeros(4))
    np.testing.assert_allclose(zeros["point"], zeros["lo"])

    seen = {}

    def extra(groups, start, confidence):
        seen.update(groups=groups.copy(), start=start.copy(), confidence=confidence)
        return np.full(len(start), 100.0)  # absurd: must be clipped to the unreached count

    clipped = walk_blocks(log, 4, extra)
    np.testing.assert_allclose(clipped["point"], clipped["hi"])
    # asked for the blocks with unreached positions only (wa-1 is used up, wb-0 ended at
    # eos), at the first position (0-based) their walk did not reach, by workload number
    asked = (clipped["hi"] > clipped["lo"]).nonzero()[0]
    keys = [(clipped["rid"][i], int(clipped["block_fct"][i])) for i in asked]
    assert keys == [("wa-0", 10), ("wb-1", 11)]
    assert seen["start"].tolist() == [3, 2] and seen["groups"].tolist() == [0, 1]
    assert seen["confidence"] is None
    with pytest.raises(ValueError):
        walk_blocks(log, 4, np.ones(3))


def test_gamma_is_implied_and_checked():
    log = read_block_accept_jsonl(HAND)
    implied = walk_blocks(log)
    np.testing.assert_allclose(implied["hi"], walk_blocks(log, 4)["hi"])
    with pytest.raises(ValueError, match="gamma"):
        walk_blocks(log, 5)


def test_malformed_and_truncated_lines_are_counted():
    lines = [
        *HAND[:4],
        "not json at all",
        json.dumps({"rid": 7, "fct": 1, "w": 1, "cl": 1, "ct": 0}),  # rid not a string
        json.dumps({"rid": "wa-9", "fct": 1}),  # a row without w/cl/ct
        json.dumps({"rid": "wa-9", "fct": 2, "w": 1, "cl": 1, "ct": 0, "trimmed_tokens": [1]}),
        json.dumps({"rid": "wa-9", "fct": 3, "w": 1, "cl": 2, "ct": 0}),  # cl > w
        "",
        *HAND[4:],
        HAND[0][:37],  # the server died mid-write
    ]
    log = read_block_accept_jsonl(lines)
    assert log.bad_lines == 6
    assert [n for n, _ in log.bad_line_samples] == [5, 6, 7, 8, 9, len(lines)]
    assert log.n_blocks == 4 and log.n_rows == 7
    np.testing.assert_allclose(
        walk_blocks(log, 4)["lo"], walk_blocks(read_block_accept_jsonl(HAND), 4)["lo"]
    )


def test_path_and_bytes_sources_and_orphans(tmp_path):
    path = tmp_path / "ba.jsonl"
    # A file that starts after wa-0's block opened: its later entry is an orphan.
    body = "\n".join([*HAND[1:], HAND[1], json.dumps({"rid": "zz-1", "eos_end": [3]})])
    path.write_text(body + '\n{"rid": "wa-1", "fct": 99, "w"')
    log = read_block_accept_jsonl(path)
    assert log.bad_lines == 1
    assert log.orphan_entries == 1 and log.duplicate_rows == 1 and log.unknown_eos == 1
    assert log.n_blocks == 3
    from_bytes = read_block_accept_jsonl(path.read_bytes().splitlines(keepends=True))
    assert from_bytes.counts == log.counts


def test_nonfinite_log_probs_like_json_dumps_writes_them():
    lines = [
        _row("x-0", 1, 0, 0, tail=[1, 2], q=[0.5, 0.5], pg=[[1, 1, float("-inf"), 1, 1]]),
        _row("x-1", 1, 0, 0, tail=[1, 2], q=[0.5, 0.5], pg=[[1, 1, float("nan"), 1, 1]]),
    ]
    assert "-Infinity" in lines[0] and "NaN" in lines[1]
    log = read_block_accept_jsonl(lines)
    # -Infinity is a masked token (never accepted); NaN is no log-probability: SGLang's
    # min(1.0, exp(nan)) would count the token as accepted, so the line is refused instead
    assert log.bad_lines == 1 and log.bad_line_samples[0][0] == 2
    assert "p_lp is NaN" in log.bad_line_samples[0][1]
    blocks = _by_key(walk_blocks(log, 2))
    assert blocks["x-0", 1]["lo"] == 0.0 and blocks["x-0", 1]["hi"] == 0.0
    assert ("x-1", 1) not in blocks


def test_workload_default_and_custom():
    assert default_workload_of("gsm8k-12") == "gsm8k"
    assert default_workload_of("multi-part-name-3") == "multi-part-name"
    assert default_workload_of("plain") == "plain"
    blocks = walk_blocks(read_block_accept_jsonl(HAND), 4)
    summary = summarize_by_workload(blocks, lambda rid: "all")
    assert list(summary) == ["all"] and summary["all"]["blocks"] == 4


# ---------------------------------------------------------------- the sample file


def _dump_reqs() -> tuple[int, dict]:
    info = json.loads(SAMPLE_DUMP.read_text())["internal_states"][0]["dspark_info_record"]
    reqs = {(r["rid"], rec["forward_ct"]): r for rec in info["records"] for r in rec["reqs"]}
    return info["gamma"], reqs


def test_sample_file_matches_server_info_dump():
    gamma, reqs = _dump_reqs()
    log = read_block_accept_jsonl(SAMPLE_JSONL)
    damage = {
        k: v for k, v in log.counts.items() if k not in ("lines", "rows", "blocks", "entries")
    }
    assert damage == dict.fromkeys(damage, 0)
    assert gamma == 7
    # Every row is a request-step of the dump, with its window, accepted and trim.
    assert log.n_rows == len(reqs)
    for rid, fct, w, cl, ct in zip(
        log.row_rid, log.row_fct, log.row_window, log.row_cl, log.row_ct, strict=True
    ):
        req = reqs[str(rid), int(fct)]
        assert (w, cl, ct) == (req["verify_len"] - 1, req["correct_drafts"], req["cap_trim"])
    # Blocks are exactly the censored steps, a == w < gamma, tails = draft_tokens[w:gamma].
    censored = {
        key for key, r in reqs.items() if r["correct_drafts"] == r["verify_len"] - 1 < gamma
    }
    assert {(str(r), int(f)) for r, f in zip(log.block_rid, log.block_fct, strict=True)} == censored
    for i in range(log.n_blocks):
        req = reqs[str(log.block_rid[i]), int(log.block_fct[i])]
        w = int(log.block_window[i])
        assert w == req["verify_len"] - 1 == req["correct_drafts"] < gamma
        tail = log.tail_tokens[log.tail_indptr[i] : log.tail_indptr[i + 1]]
        assert tail.tolist() == req["draft_tokens"][w:gamma]


def test_sample_walk_realized_tokens_are_the_committed_ones():
    """`realized` at offset o is what the dump committed at anchor + o."""
    _, reqs = _dump_reqs()
    log = read_block_accept_jsonl(SAMPLE_JSONL)
    assert log.token_mismatches == 0 and log.orphan_entries == 0
    for b, o, realized, fct in zip(
        log.entry_block, log.entry_offset, log.entry_realized, log.entry_fct, strict=True
    ):
        rid = str(log.block_rid[b])
        opened, now = reqs[rid, int(log.block_fct[b])], reqs[rid, int(fct)]
        row = opened["prefix_len"] - 1 + int(o) - now["prefix_len"]
        committed = [*now["draft_tokens"][: now["correct_drafts"]], now["bonus_token"]]
        assert committed[row] == realized


def test_sample_walk_and_summary():
    log = read_block_accept_jsonl(SAMPLE_JSONL)
    blocks = walk_blocks(log, 7)
    assert (blocks["walked"] >= 1).all()  # the opening row walks offset w+1 itself
    assert set(blocks["status"].tolist()) <= {"resolved", "open"}  # no eos markers here
    summary = summarize_by_workload(blocks, log=log)
    assert sorted(summary) == ["arena", "gsm8k", "poetry"]
    assert sum(s["blocks"] for s in summary.values()) == log.n_blocks
    assert sum(s["all_steps"]["steps"] for s in summary.values()) == log.n_rows
    for s in summary.values():
        assert s["ci_lo"] <= s["mean_lo"] <= s["mean_point"] <= s["mean_hi"] <= s["ci_hi"] <= 7
        assert s["open"] + s["resolved"] + s["eos"] == s["blocks"]


# ---------------------------------------------------------------- properties


def _brute_force(a: list[float]) -> tuple[float, float]:
    """Mean and variance of the leading-accept count of independent Bernoulli(a_i)."""
    mean = second = 0.0
    for outcome in itertools.product((0, 1), repeat=len(a)):
        p = math.prod(ai if x else 1 - ai for ai, x in zip(a, outcome, strict=True))
        n = next((i for i, x in enumerate(outcome) if not x), len(a))
        mean += p * n
        second += p * n * n
    return mean, second - mean**2


def _lp(a: float) -> float:
    return math.log(a) if a > 0 else float("-inf")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8), st.integers(0, 3))
def test_variance_formula_equals_brute_force(a, w):
    gamma = w + len(a)
    tail = list(range(100, 100 + len(a)))
    line = {
        "rid": "p-0",
        "fct": 0,
        "w": w,
        "cl": w,
        "ct": 0,
        "trimmed_tokens": tail,
        "q_lp": [0.0] * len(a),
        "pg": [
            [0, w + 1 + i, _lp(ai), t, t] for i, (ai, t) in enumerate(zip(a, tail, strict=True))
        ],
    }
    blocks = walk_blocks(read_block_accept_jsonl([json.dumps(line)]), gamma)
    mean, var = _brute_force(a)
    assert blocks["status"][0] == "resolved"
    assert blocks["lo"][0] - w == pytest.approx(mean, abs=1e-9)
    assert blocks["var"][0] == pytest.approx(var, abs=1e-9)


@st.composite
def _files(draw):
    gamma = draw(st.integers(1, 8))
    lines, n = [], draw(st.integers(1, 6))
    for k in range(n):
        w = draw(st.integers(0, gamma - 1))
        tail = draw(st.lists(st.integers(0, 9), min_size=gamma - w, max_size=gamma - w))
        q = draw(st.lists(st.floats(-6, 0), min_size=len(tail), max_size=len(tail)))
        walked = draw(st.integers(0, len(tail)))
        pg = []
        for j in range(walked):
            diverge = draw(st.booleans())
            realized = tail[j] + 1 if diverge else tail[j]
            pg.append([k, w + 1 + j, draw(st.floats(-8, 0)), tail[j], realized])
            if diverge:
                break
        rid = f"{draw(st.sampled_from(['a', 'b']))}-{k}"
        obj = {"rid": rid, "fct": k, "w": w, "cl": w, "ct": 0, "trimmed_tokens": tail, "q_lp": q}
        lines.append(json.dumps(obj))
        if pg:
            lines.append(
                json.dumps({"rid": rid, "fct": 100 + k, "w": 1, "cl": 0, "ct": 0, "pg": pg})
            )
        if draw(st.booleans()):
            lines.append(json.dumps({"rid": rid, "eos_end": [k]}))
    return gamma, lines


@settings(max_examples=200, deadline=None)
@given(_files(), st.sampled_from(["default", "ones", "zeros", "wild"]))
def test_bounds_hold(file, how):
    gamma, lines = file
    extrapolate = {
        "default": None,
        "ones": np.ones(gamma),
        "zeros": np.zeros(gamma),
        "wild": lambda groups, start, conf: np.linspace(-5, 50, len(start)),
    }[how]
    log = read_block_accept_jsonl(lines)
    assert log.bad_lines == 0
    b = walk_blocks(log, gamma, extrapolate)
    eps = 1e-12
    assert (b["lo"] >= b["window"] - eps).all()
    assert (b["lo"] <= b["point"] + eps).all() and (b["point"] <= b["hi"] + eps).all()
    assert (b["hi"] <= gamma + eps).all()
    assert (b["var"] >= 0).all()
    assert (b["lo"][b["status"] == "eos"] == b["hi"][b["status"] == "eos"]).all()
    for s in summarize_by_workload(b).values():
        assert s["ci_lo"] <= s["mean_lo"] <= s["mean_hi"] <= s["ci_hi"]


def test_interval_covers_simulated_cap_accept_mean():
    """Blocks whose full-verification outcome is known: the interval should cover its mean."""
    rng = np.random.default_rng(7)
    gamma, covered, reps = 7, 0, 40
    for _ in range(reps):
        lines, truth = [], []
        for k in range(150):
            w = int(rng.integers(0, gamma))
            a = rng.beta(3, 1.5, size=gamma - w)
            accepted = int(np.argmin(np.append(rng.random(gamma - w) < a, False)))
            truth.append(w + accepted)
            tail = list(range(gamma - w))
            pg = []
            for j in range(gamma - w):
                diverge = rng.random() < 0.3
                pg.append([k, w + 1 + j, _lp(float(a[j])), j, j + 1 if diverge else j])
                if diverge:
                    break
            lines.append(
                _row(
                    f"s-{k}",
                    k,
                    w,
                    w,
                    tail=tail,
                    q=[1.0] * len(tail),
                    pg=pg[:1] if k % 9 == 0 else pg,
                )
            )
        s = summarize_by_workload(walk_blocks(read_block_accept_jsonl(lines), gamma))["s"]
        covered += s["ci_lo"] <= np.mean(truth) <= s["ci_hi"]
    assert covered >= 0.9 * reps


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5), st.integers(0, 4))
def test_reach_all_variance_equals_brute_force(a, unreached):
    """var_hi: the walk's outcome N_w by enumeration, then N_hi = N_w + U where the walk
    accepted every walked draft (each unreached draft then accepted too)."""
    walked = len(a)
    mean = second = 0.0
    for outcome in itertools.product((0, 1), repeat=walked):
        p = math.prod(ai if x else 1 - ai for ai, x in zip(a, outcome, strict=True))
        n = next((i for i, x in enumerate(outcome) if not x), walked)
        n += unreached if n == walked else 0
        mean += p * n
        second += p * n * n
    prods = np.cumprod(a)
    var = float((np.arange(1, walked + 1) * 2 - 1) @ prods - prods.sum() ** 2)
    got = interval.reach_all_variance(
        np.array([var]), np.array([prods.sum()]), np.array([prods[-1]]),
        np.array([walked]), np.array([unreached]),
    )  # fmt: skip
    assert got[0] == pytest.approx(second - mean**2, abs=1e-9)


def test_upper_end_holds_its_level_with_few_blocks():
    """Twenty blocks of window 1 (gamma 7) whose walk diverges at once with a = 0.1, and
    whose tail would then run to gamma: the realised mean is 1 + 6 X / 20, X ~ Binomial(20,
    0.1), exactly. Its upper tail is far heavier than the normal one (1.96 standard errors
    above the mean of `hi` it passes with chance 0.043); the interval's upper end must be
    passed with chance 0.025 at most."""
    gamma, w, a1, n = 7, 1, 0.1, 20
    tail = list(range(gamma - w))
    lines = [
        _row(f"copy-{k}", k, w, w, tail=tail, q=[1.0] * len(tail), pg=[[k, w + 1, _lp(a1), 0, 1]])
        for k in range(n)
    ]
    s = summarize_by_workload(walk_blocks(read_block_accept_jsonl(lines), gamma, np.ones(gamma)))
    s = s["copy"]
    assert s["mean_hi"] == pytest.approx(w + (gamma - w) * a1)
    x = np.arange(n + 1)
    law = np.array([math.comb(n, k) * a1**k * (1 - a1) ** (n - k) for k in x])
    realised = w + (gamma - w) * x / n
    assert law[realised > s["ci_hi"]].sum() <= 0.025
    assert law[realised < s["ci_lo"]].sum() <= 0.025


def test_upper_end_covers_tails_that_run_to_gamma_once_reached():
    """Blocks whose first tail draft is rarely accepted but whose later drafts always would
    be (a copy-like workload: the walk diverges at once): the realised mean sits above
    the mean of `hi` by more than the walked positions' noise allows. The upper end's
    spread is that of the outcome with every unreached draft accepted, so it covers."""
    rng = np.random.default_rng(11)
    gamma, w, a1, reps, n = 7, 1, 0.02, 300, 100
    lines, truth = [], {}
    for r in range(reps):
        accepted = rng.random(n) < a1  # then every later draft: the tail runs to gamma
        truth[f"r{r}"] = w + (gamma - w) * accepted.mean()
        for k in range(n):
            tail = list(range(gamma - w))
            pg = [[k, w + 1, _lp(a1), 0, 1]]  # the committed token left the tail at once
            lines.append(_row(f"r{r}-{k}", k, w, w, tail=tail, q=[1.0] * len(tail), pg=pg))
    blocks = walk_blocks(read_block_accept_jsonl(lines), gamma, np.ones(gamma))
    summary = summarize_by_workload(blocks)
    covered = old_covered = 0
    for name, s in summary.items():
        covered += s["ci_lo"] <= truth[name] <= s["ci_hi"]
        old_covered += s["ci_lo"] <= truth[name] <= s["mean_hi"] + 1.96 * s["se"]
    # by hand: N = 6 with chance .02, so var_hi = 36 * .02 * .98 per block
    s = summary["r0"]
    assert s["se_hi"] == pytest.approx(math.sqrt(36 * a1 * (1 - a1) / n))
    assert covered >= 0.9 * reps  # 0.95 in theory (Binomial(100, .02) <= 4)
    assert old_covered < 0.8 * reps
