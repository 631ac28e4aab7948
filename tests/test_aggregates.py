"""Live aggregates and their Prometheus text, each number against an independent computation.

The exporter's numbers come out of fixed-size histograms folded from whole
columns; every check here recomputes the same quantity from the raw StepBatch
columns instead (numpy over rows, a per-row Python loop for labels,
torchmetrics for ECE, scikit-learn for AUROC, a per-step least-squares fit for
the cost model), so a mistake in the histogram bookkeeping cannot cancel out.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import warnings
from collections import defaultdict

import numpy as np
import pytest
import torch
from dspark_obs.exporters.collector import Collector
from sklearn.metrics import roc_auc_score
from torchmetrics.classification import BinaryCalibrationError

from dspark_obs.aggregates import Aggregates, cost_model
from dspark_obs.aggregates import rows as request_rows
from dspark_obs.aggregates.steps import quantity_histogram
from dspark_obs.aggregates.tokens import histogram_slices
from dspark_obs.calibration import prefix_labels
from dspark_obs.domain.step_cost import DEFAULT_BS_PROBES, DEFAULT_M_PROBES
from dspark_obs.pipeline import Pipeline
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.sources.stats import IngestStats
from dspark_obs.telemetry import StepBatch

GAMMA = 7
EPS = 1e-8
#: Prometheus `le` bounds of the step histograms: powers of two up to 8192.
COUNT_BOUNDS = [2**k for k in range(14)]
#: Relative-error buckets: 81 log-spaced upper bounds from 1e-4 to 10.
REL_EDGES = np.logspace(-4, 1, 81)


def runtime(steps: int, seed: int, **kw) -> list[StepBatch]:
    kw.setdefault("concurrency", [32])
    return list(DSparkRuntime(RuntimeConfig(steps_per_level=steps, seed=seed, **kw)).run())


# ------------------------------------------------------------ exposition parser

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def parse_exposition(text: str) -> tuple[dict[str, dict[frozenset, float]], dict[str, str]]:
    """`({sample name: {label set: value}}, {family: type})`; strict about syntax."""
    samples: dict[str, dict[frozenset, float]] = defaultdict(dict)
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"unparsable sample line: {line!r}"
        name, raw, value = m.groups()
        labels = {}
        if raw:
            pos = 0
            for lm in _LABEL.finditer(raw):
                assert lm.start() == pos, f"bad label syntax in {line!r}"
                labels[lm.group(1)] = _unescape(lm.group(2))
                pos = lm.end()
            assert pos == len(raw), f"bad label syntax in {line!r}"
        key = frozenset(labels.items())
        assert key not in samples[name], f"duplicate series {line!r}"
        samples[name][key] = float(value)
    return dict(samples), types


def sample(samples, name: str, **labels) -> float | None:
    return samples.get(name, {}).get(frozenset((k, str(v)) for k, v in labels.items()))


def render(snap, stats: IngestStats | None = None) -> str:
    """Every family, those of fine detail included (`--detail-metrics`)."""
    return Collector(detail=True).collect(snap, (stats or IngestStats()).snapshot()).decode()


# ------------------------------------------------------- independent row tables


def ceiling_of(b: StepBatch) -> np.ndarray:
    """Full-block ceiling where the mode shows it: static verifies everything, cap-accept
    reports the accepted run past the window in cap_trim; compact shows nothing (-1)."""
    if b.mode == "static":
        return b.correct_drafts.astype(np.int64)
    if b.mode == "cap-accept":
        return (b.correct_drafts + b.cap_trim).astype(np.int64)
    return np.full(b.num_reqs, -1, np.int64)


def collect(batches: list[StepBatch]) -> dict[str, np.ndarray]:
    """All request rows of the batches, one column each; `key` is (workload, mode, rank)."""
    cols = defaultdict(list)
    for s, b in enumerate(batches):
        n = b.num_reqs
        if not n:
            continue
        cols["step"].append(np.full(n, s))
        cols["window"].append(b.verify_len - 1)
        cols["accepted"].append(b.correct_drafts)
        cols["committed"].append(b.acc_len)
        cols["observed"].append(ceiling_of(b))
        cols["shadow"].append(b.shadow_ceiling)
        surv = b.survival if b.survival is not None else np.full((n, b.gamma), np.nan)
        cols["survival"].append(surv)
        cols["key"].append([(str(w), b.mode, int(b.rank)) for w in b.workload])
    out = {k: np.concatenate(v) for k, v in cols.items() if k != "key"}
    out["key"] = [k for part in cols["key"] for k in part]
    return out


def group_rows(rows) -> dict[tuple, np.ndarray]:
    idx = defaultdict(list)
    for i, k in enumerate(rows["key"]):
        idx[k].append(i)
    return {k: np.array(v) for k, v in idx.items()}


def token_expect(rows, idx) -> dict:
    g = GAMMA
    w, a, c = rows["window"][idx], rows["accepted"][idx], rows["committed"][idx]
    obs, sh = rows["observed"][idx], rows["shadow"][idx]
    known = np.where(obs >= 0, obs, sh)
    k = known >= 0
    return {
        "n": len(idx),
        "window": np.bincount(w, minlength=g + 1),
        "accepted": np.bincount(a, minlength=g + 1),
        "committed": np.bincount(c, minlength=g + 2),
        "ceiling_observed": np.bincount(obs[obs >= 0], minlength=g + 1),
        "ceiling_shadow": np.bincount(sh[(obs < 0) & (sh >= 0)], minlength=g + 1),
        "accepted_known": np.bincount(a[k], minlength=g + 1),
        "sum_window": int(w.sum()),
        "sum_accepted": int(a.sum()),
        "sum_committed": int(c.sum()),
        "trimmed": int((g - w).sum()),
        "known_rows": int(k.sum()),
        "known_ceiling": int(known[k].sum()),
        "known_accepted": int(a[k].sum()),
    }


def loop_labels(rows) -> tuple[np.ndarray, np.ndarray]:
    """Prefix labels one row and position at a time, straight from the definition.

    Label at j: the first j+1 drafts are accepted. A known ceiling (observed, else the
    shadow twin's) answers every position; a censored row answers its accepted
    positions, and the rest only if it rejected inside its window.
    """
    n = len(rows["window"])
    labels = np.zeros((n, GAMMA), bool)
    labelled = np.zeros((n, GAMMA), bool)
    for i in range(n):
        a, w = int(rows["accepted"][i]), int(rows["window"][i])
        c = int(rows["observed"][i])
        if c < 0:
            c = int(rows["shadow"][i])
        for j in range(GAMMA):
            if c >= 0:
                labelled[i, j], labels[i, j] = True, j + 1 <= c
            elif j + 1 <= a:
                labelled[i, j], labels[i, j] = True, True
            elif a < w:
                labelled[i, j], labels[i, j] = True, False
    return labels, labelled


def check_token_table(table: np.ndarray, exp: dict) -> None:
    for name, sl in histogram_slices(GAMMA).items():
        np.testing.assert_array_equal(table[sl], exp[name], err_msg=name)


def check_calibration(
    metrics: dict, gi: int, surv, labels, labelled, auroc: bool = True
) -> dict[str, float]:
    """Every per-position metric of group `gi` against torchmetrics / sklearn / numpy.

    AUROC is published over the sliding window only, so `auroc=False` skips it for
    the since-start table. Returns the largest deviations seen, for the record.
    """
    worst = defaultdict(float)
    for j in range(GAMMA):
        sel = labelled[:, j]
        assert metrics["count"][gi, j] == sel.sum()
        if not sel.any():
            assert np.isnan(metrics["ece"][gi, j])
            continue
        p = np.clip(surv[sel, j], EPS, 1 - EPS)
        y = labels[sel, j]
        # torchmetrics buckets with bucketize(right=True) on linspace(0, 1, 16), the
        # aggregate with floor(p * 1020) // 68; both are floor(15 p) except within
        # rounding of an edge k/15, where the float edge and the float product may
        # disagree. Such a prediction would test float rounding, not the aggregate,
        # so the data must keep clear of the edges (clamped values 1e-8 and 1 - 1e-8
        # included: they sit 1.5e-7 away).
        assert np.abs(p * 15 - np.round(p * 15)).min() > 1e-9
        ece = BinaryCalibrationError(n_bins=15, norm="l1")(
            torch.from_numpy(p), torch.from_numpy(y.astype(np.int64))
        ).item()
        worst["ece"] = max(worst["ece"], abs(metrics["ece"][gi, j] - ece))
        assert metrics["ece"][gi, j] == pytest.approx(ece, abs=1e-9)
        brier = np.mean((p - y) ** 2)
        assert metrics["brier"][gi, j] == pytest.approx(brier, rel=1e-10, abs=1e-12)
        assert metrics["pred_mean"][gi, j] == pytest.approx(p.mean(), rel=1e-12)
        assert metrics["target_mean"][gi, j] == pytest.approx(y.mean(), rel=1e-12)
        if not auroc:
            continue
        if y.all() or not y.any():
            assert np.isnan(metrics["auroc"][gi, j])
            continue
        exact = roc_auc_score(y, p)
        # Only a positive and a negative sharing one of the 1,020 fine bins can be
        # ordered wrongly (they count half): bound = 0.5 sum_b P_b N_b / (P N).
        fine = np.minimum((p * 1020).astype(np.int64), 1019)
        pos = np.bincount(fine[y], minlength=1020)
        neg = np.bincount(fine[~y], minlength=1020)
        bound = 0.5 * (pos * neg).sum() / (pos.sum() * neg.sum())
        dev = abs(metrics["auroc"][gi, j] - exact)
        worst["auroc"] = max(worst["auroc"], dev)
        worst["auroc_bound"] = max(worst["auroc_bound"], bound)
        assert dev <= bound + 1e-12
    return dict(worst)


# -------------------------------------------------------------------- fixtures

FOLDS = [False] + ([True] if request_rows._rowfold is not None else [])


@pytest.fixture(scope="module", autouse=True, params=FOLDS, ids=lambda c: "C" if c else "numpy")
def row_fold(request):
    """Every test here runs once per request-row fold: each Aggregates built uses it."""
    with pytest.MonkeyPatch.context() as mp:
        init = functools.partialmethod(Aggregates.__init__, compiled=request.param)
        mp.setattr(Aggregates, "__init__", init)
        yield request.param


@pytest.fixture(scope="module")
def mixed_batches():
    """Four runs interleaved: compact with a half shadow, compact alone (moved to rank 1 to
    keep its groups apart), cap-accept and static. Made once for both folds."""
    runs = [
        runtime(100, 3, mode="compact", shadow="cap-accept", shadow_fraction=0.5),
        [dataclasses.replace(b, rank=1) for b in runtime(100, 4, mode="compact")],
        runtime(100, 5, mode="cap-accept"),
        runtime(100, 6, mode="static"),
    ]
    return [b for step in zip(*runs, strict=True) for b in step]


@pytest.fixture(scope="module")
def mixed(row_fold, mixed_batches):
    """The four runs in one Aggregates of the fold in use."""
    batches = mixed_batches
    agg = Aggregates(GAMMA)
    for b in batches:
        agg.update(b)
    snap = agg.snapshot()
    return batches, snap, parse_exposition(render(snap))[0]


@pytest.fixture(scope="module")
def sweep():
    """500 compact steps at two batch sizes, so the cost refit sees several bs and M."""
    return runtime(250, 11, mode="compact", shadow="cap-accept", shadow_fraction=0.5,
                   concurrency=[8, 32])  # fmt: skip


# ---------------------------------------------------------------- 1. tokens


def test_token_histograms_match_numpy(mixed):
    batches, snap, _ = mixed
    rows = collect(batches)
    groups = group_rows(rows)
    assert set(snap.groups) == set(groups)
    assert {m for _, m, _ in snap.groups} == {"compact", "cap-accept", "static"}
    assert len(batches) < snap.window_steps  # so the window still holds every step
    for gi, key in enumerate(snap.groups):
        exp = token_expect(rows, groups[key])
        check_token_table(snap.tokens["total"][gi], exp)
        check_token_table(snap.tokens["window"][gi], exp)
        _, mode, rank = key
        if mode == "compact" and rank == 0:
            assert exp["ceiling_shadow"].sum() > 0 and exp["known_rows"] < exp["n"]
        if mode == "compact" and rank == 1:
            assert exp["known_rows"] == 0
        if mode == "static":
            assert exp["trimmed"] == 0


def test_rendered_token_metrics_match_numpy(mixed):
    batches, _, s = mixed
    rows = collect(batches)
    for (wl, mode, rank), idx in group_rows(rows).items():
        lab = {"workload": wl, "mode": mode, "rank": rank}
        exp = token_expect(rows, idx)
        n = exp["n"]
        assert sample(s, "dspark_request_steps_total", **lab) == n
        for metric, name, top in (
            ("dspark_window_tokens", "window", GAMMA),
            ("dspark_accepted_tokens", "accepted", GAMMA),
            ("dspark_committed_tokens", "committed", GAMMA + 1),
        ):
            col = rows[name][idx]
            for le in range(top + 1):
                got = sample(s, f"{metric}_bucket", **lab, le=le)
                assert got == np.count_nonzero(col <= le), (metric, le)
            assert sample(s, f"{metric}_bucket", **lab, le="+Inf") == n
            assert sample(s, f"{metric}_count", **lab) == n
            assert sample(s, f"{metric}_sum", **lab) == exp[f"sum_{name}"]
        for source in ("observed", "shadow"):
            hist = exp[f"ceiling_{source}"]
            got = sample(s, "dspark_ceiling_tokens_count", **lab, source=source)
            if hist.sum() == 0:
                assert got is None
                continue
            assert got == hist.sum()
            assert sample(s, "dspark_ceiling_tokens_sum", **lab, source=source) == (
                hist @ np.arange(GAMMA + 1)
            )
            for le in range(GAMMA + 1):
                got = sample(s, "dspark_ceiling_tokens_bucket", **lab, source=source, le=le)
                assert got == hist[: le + 1].sum()
        assert sample(s, "dspark_trimmed_draft_tokens_total", **lab) == exp["trimmed"]
        assert sample(s, "dspark_trim_loss_tokens_total", **lab) == (
            exp["known_ceiling"] - exp["known_accepted"]
        )
        w = rows["window"][idx]
        assert sample(s, "dspark_window_mean_tokens", **lab) == pytest.approx(w.mean(), rel=1e-12)
        assert sample(s, "dspark_accepted_mean_tokens", **lab) == pytest.approx(
            rows["accepted"][idx].mean(), rel=1e-12
        )
        for metric in ("dspark_utilisation_cumulative_ratio", "dspark_utilisation_ratio"):
            got = sample(s, metric, **lab)
            if exp["known_ceiling"] == 0:
                assert got is None  # no known ceiling: no sample, never 0 or 1
            else:
                want = exp["known_accepted"] / exp["known_ceiling"]
                assert got == pytest.approx(want, rel=1e-12)
                assert 0 < got <= 1
        if exp["known_rows"]:
            assert sample(s, "dspark_ceiling_mean_tokens", **lab) == pytest.approx(
                exp["known_ceiling"] / exp["known_rows"], rel=1e-12
            )


def test_rendered_step_histograms_match_numpy(mixed):
    batches, _, s = mixed
    by_group = defaultdict(list)
    for b in batches:
        by_group[(b.mode, b.rank)].append(b)
    for (mode, rank), bs in by_group.items():
        assert sample(s, "dspark_steps_total", mode=mode, rank=rank) == len(bs)
        for metric, values in (
            ("dspark_batch_size", [b.bs for b in bs]),
            ("dspark_budget_tokens", [b.budget for b in bs if b.budget is not None]),
            ("dspark_verify_tokens", [b.num_verify_tokens for b in bs]),
            ("dspark_graph_tier_tokens", [b.verify_tokens_graph_key for b in bs]),
        ):
            v = np.array(values, dtype=np.float64)
            count = sample(s, f"{metric}_count", mode=mode, rank=rank)
            if not len(v):
                assert count is None and mode == "static"
                continue
            assert count == len(v)
            assert sample(s, f"{metric}_sum", mode=mode, rank=rank) == pytest.approx(v.sum())
            for le in COUNT_BOUNDS:
                got = sample(s, f"{metric}_bucket", mode=mode, rank=rank, le=le)
                assert got == np.count_nonzero(v <= le), (metric, le)


# ----------------------------------------------------------- 2. calibration


def test_loop_labels_agree_with_prefix_labels(mixed):
    rows = collect(mixed[0][:40])
    labels, labelled = loop_labels(rows)
    known = np.where(rows["observed"] >= 0, rows["observed"], rows["shadow"])
    lib_labels, lib_labelled = prefix_labels(rows["accepted"], rows["window"], known, GAMMA)
    np.testing.assert_array_equal(lib_labelled, labelled)
    np.testing.assert_array_equal(lib_labels[labelled], labels[labelled])
    # the censored case is really exercised: some positions are left out
    assert not labelled.all()


def test_confidence_matches_torchmetrics_and_sklearn(mixed):
    batches, snap, s = mixed
    rows = collect(batches)
    labels, labelled = loop_labels(rows)
    groups = group_rows(rows)
    seen_censored = False
    for gi, key in enumerate(snap.groups):
        idx = groups[key]
        lab, lld, surv = labels[idx], labelled[idx], rows["survival"][idx]
        if key[1] == "compact" and key[2] == 1:
            # compact alone: a fully accepted window says nothing past its end
            full = rows["accepted"][idx] == rows["window"][idx]
            short = full & (rows["window"][idx] < GAMMA)
            assert short.any()
            assert not lld[short, GAMMA - 1].any()
            seen_censored = True
        check_calibration(snap.confidence["total"], gi, surv, lab, lld, auroc=False)
        check_calibration(snap.confidence["window"], gi, surv, lab, lld)
        wl, mode, rank = key
        for j in range(GAMMA):
            pos = {"workload": wl, "mode": mode, "rank": rank, "position": j}
            assert sample(s, "dspark_confidence_labelled_total", **pos) == lld[:, j].sum()
            got = sample(s, "dspark_confidence_ece_cumulative", **pos)
            assert got == snap.confidence["total"]["ece"][gi, j]
    # reliability, summed over ranks: the survival histogram holds the same rows, cumulatively
    wl_mode = [(k[0], k[1]) for k in snap.groups]
    for wl, mode in sorted(set(wl_mode)):
        idx = np.concatenate([groups[k] for k in snap.groups if (k[0], k[1]) == (wl, mode)])
        lab, lld, surv = labels[idx], labelled[idx], rows["survival"][idx]
        for j in range(GAMMA):
            pos = {"workload": wl, "mode": mode, "position": j}
            p = np.clip(surv[lld[:, j], j], EPS, 1 - EPS)
            y = lab[lld[:, j], j]
            for k in range(1, 15):
                le = f"{k / 15:.6g}"
                in_bins = np.count_nonzero(p < k / 15)
                assert sample(s, "dspark_confidence_survival_bucket", **pos, le=le) == in_bins
                assert sample(
                    s, "dspark_confidence_accepted_survival_bucket", **pos, le=le
                ) == np.count_nonzero(y & (p < k / 15))
            # the ECE-bin counters, summed over ranks, and AUROC's rejected rows below a bin
            b = np.minimum((p * 15).astype(np.int64), 14)
            for k in range(15):
                rows_k, pos_k = np.count_nonzero(b == k), np.count_nonzero(y & (b == k))
                if not len(p):
                    break
                assert sample(s, "dspark_confidence_bin_rows_total", **pos, bin=k) == rows_k
                assert sample(s, "dspark_confidence_bin_positives_total", **pos, bin=k) == pos_k
                below = np.count_nonzero(~y & (b < k))
                name = "dspark_confidence_bin_negatives_below_total"
                assert sample(s, name, **pos, bin=k) == below
    assert seen_censored


# -------------------------------------------------------- 3. sliding window


def ring_steps(n: int, window_steps: int = 64, blocks: int = 8) -> int:
    """Steps a ring of `blocks` blocks holds after `n` steps.

    The current block holds the n mod block steps since the last rotation; every
    rotation clears the block it moves into, so the other blocks - 1 blocks are
    full: (blocks - 1) * block + n mod block, between window - block and window - 1.
    """
    block = window_steps // blocks
    return min(n, (blocks - 1) * block + n % block)


def check_window(snap, batches: list[StepBatch], k: int) -> None:
    last = batches[len(batches) - k :]
    rows = collect(last)
    groups = group_rows(rows)
    labels, labelled = loop_labels(rows)
    for gi, key in enumerate(snap.groups):
        idx = groups.get(key, np.array([], dtype=np.int64))
        check_token_table(snap.tokens["window"][gi], token_expect(rows, idx))
        check_calibration(
            snap.confidence["window"], gi, rows["survival"][idx], labels[idx], labelled[idx]
        )
    (sg,) = range(len(snap.step_groups))
    table = snap.steps["window"]
    assert table[sg, 0] == k
    for q, values in (
        ("batch_size", [b.bs for b in last]),
        ("budget", [b.budget for b in last]),
        ("verify_tokens", [b.num_verify_tokens for b in last]),
    ):
        v = np.array(values, dtype=np.float64)
        counts, sums = quantity_histogram(table, q)
        assert sums[sg] == pytest.approx(v.sum(), rel=1e-12)
        cum = np.cumsum(counts[sg])
        assert cum[-1] == k
        for i, le in enumerate(COUNT_BOUNDS):
            assert cum[i] == np.count_nonzero(v <= le)
    check_cost_errors(snap.cost["window"], sg, last)


def check_cost_errors(metrics: dict, sg: int, batches: list[StepBatch]) -> None:
    pred = np.array([b.predicted_step_ms for b in batches], dtype=np.float64) / 1e3
    meas = np.array([b.step_gpu_ms for b in batches], dtype=np.float64) / 1e3
    err = meas - pred
    assert metrics["steps"][sg] == len(batches)
    for key, want in (
        ("predicted_mean", pred.mean()),
        ("measured_mean", meas.mean()),
        ("abs_error_mean", np.abs(err).mean()),
        ("bias", err.mean()),
        ("rms_error", np.sqrt(np.mean(err**2))),
        ("rel_error_mean", np.mean(np.abs(err) / meas)),
    ):
        assert metrics[key][sg] == pytest.approx(want, rel=1e-9, abs=1e-15), key
    # median: the smallest bucket bound with at least half the steps at or below it
    rel = np.abs(err) / meas
    median = next(e for e in REL_EDGES if np.count_nonzero(rel <= e) >= len(rel) / 2)
    assert metrics["rel_error_median"][sg] == median


def test_window_holds_exactly_the_last_ring_steps(sweep):
    agg = Aggregates(GAMMA, window_steps=64, segments=8, flush_rows=1)
    checkpoints = {40, 64, 263, 500}
    for n, b in enumerate(sweep, 1):
        agg.update(b)
        if n in checkpoints:
            k = ring_steps(n)
            assert k == n or 56 <= k < 64
            check_window(agg.snapshot(), sweep[:n], k)
    assert ring_steps(500) == 60


@pytest.mark.parametrize("flush_rows", [4096, 10**9])
def test_window_is_exact_whatever_the_flush_size(sweep, flush_rows):
    """A flush folds many steps at once; the window must still hold exactly the ring's
    steps (a flush larger than the window used to wipe it entirely)."""
    agg = Aggregates(GAMMA, window_steps=64, segments=8, flush_rows=flush_rows)
    for b in sweep[:437]:
        agg.update(b)
    check_window(agg.snapshot(), sweep[:437], ring_steps(437))


# ----------------------------------------------------------- 4. cost model


def hat(x: np.ndarray, probes) -> np.ndarray:
    """Linear interpolation weights between neighbouring probes, constant past the ends."""
    probes = [float(p) for p in probes]
    out = np.zeros((len(x), len(probes)))
    for i, v in enumerate(np.asarray(x, dtype=np.float64).tolist()):
        if v <= probes[0]:
            out[i, 0] = 1.0
        elif v >= probes[-1]:
            out[i, -1] = 1.0
        else:
            k = max(j for j in range(len(probes)) if probes[j] <= v)
            if probes[k] == v:
                out[i, k] = 1.0
            else:
                t = (v - probes[k]) / (probes[k + 1] - probes[k])
                out[i, k], out[i, k + 1] = 1.0 - t, t
    return out


def step_refit(batches: list[StepBatch]) -> tuple[float, float]:
    """(R^2, RMS) of T = bias + alpha(bs) + theta(M) fitted by least squares per step.

    M is the middle of the step's 64-token bin of verify tokens; every step of one
    (bs, bin) cell has the same design row, so this equals the aggregate's
    per-cell weighted fit exactly.
    """
    bs = np.array([b.bs for b in batches], dtype=np.float64)
    tokens = np.array([b.num_verify_tokens for b in batches])
    y = np.array([b.step_gpu_ms for b in batches]) / 1e3
    m = (tokens // 64 + 0.5) * 64
    x = np.hstack([np.ones((len(y), 1)), hat(bs, DEFAULT_BS_PROBES), hat(m, DEFAULT_M_PROBES)])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    sse = float(((y - x @ coef) ** 2).sum())
    sst = float(((y - y.mean()) ** 2).sum())
    return 1.0 - sse / sst, float(np.sqrt(sse / len(y)))


def test_cost_errors_and_refit_match_numpy(sweep, monkeypatch):
    monkeypatch.setattr(cost_model, "REFIT_EVERY", 256)
    assert len({b.bs for b in sweep}) == 2 and len({b.num_verify_tokens // 64 for b in sweep}) > 2
    big_flush = Aggregates(GAMMA, flush_rows=10**9)
    per_step = Aggregates(GAMMA, window_steps=64, segments=8, flush_rows=1)
    for b in sweep:
        big_flush.update(b)
        per_step.update(b)
    for agg in (big_flush, per_step):
        snap = agg.snapshot()
        check_cost_errors(snap.cost["total"], 0, sweep)
        (refit,) = snap.refits
        # the refit covers the first `steps` measured steps, refreshed every 256
        assert len(sweep) - 256 < refit.steps <= len(sweep)
        r2, rms = step_refit(sweep[: refit.steps])
        assert refit.r2 == pytest.approx(r2, rel=1e-9)
        assert refit.rms_seconds == pytest.approx(rms, rel=1e-9)
        assert 0 < r2 < 1
        s = parse_exposition(render(snap))[0]
        assert sample(s, "dspark_cost_model_refit_r2", mode="compact", rank=0) == refit.r2
        assert sample(s, "dspark_cost_model_refit_steps", mode="compact", rank=0) == refit.steps
        # refitting now covers every step so far, still exactly
        full = agg.cost.refit(0)
        assert full.steps == len(sweep)
        r2, rms = step_refit(sweep)
        assert full.r2 == pytest.approx(r2, rel=1e-9)
        assert full.rms_seconds == pytest.approx(rms, rel=1e-9)
    check_cost_errors(per_step.snapshot().cost["window"], 0, sweep[-ring_steps(len(sweep)) :])


def test_cost_refit_per_step_group(mixed):
    batches, snap, s = mixed
    for sg, (mode, rank) in enumerate(snap.step_groups):
        steps = [b for b in batches if (b.mode, b.rank) == (mode, rank)]
        refit = snap.refits[sg]
        cells = {(b.bs, b.num_verify_tokens // 64) for b in steps}
        if refit is None:  # one (bs, M-bin) cell: nothing to separate bias, alpha, theta by
            assert len(cells) == 1
            assert sample(s, "dspark_cost_model_refit_r2", mode=mode, rank=rank) is None
            continue
        r2, rms = step_refit(steps[: refit.steps])
        assert refit.r2 == pytest.approx(r2, rel=1e-9)
        assert refit.rms_seconds == pytest.approx(rms, rel=1e-9)
        if mode == "static":  # no prediction: nothing to compare with, a refit all the same
            assert snap.cost["total"]["steps"][sg] == 0
            assert sample(s, "dspark_step_predicted_seconds", mode=mode, rank=rank) is None
        else:
            check_cost_errors(snap.cost["total"], sg, steps)
            assert sample(s, "dspark_step_predicted_seconds_total", mode=mode, rank=rank) == (
                pytest.approx(sum(b.predicted_step_ms for b in steps) / 1e3, rel=1e-12)
            )


def test_implausible_step_scalars_are_left_out_of_the_cost_model_quietly(sweep):
    """Step scalars arrive from JSON unchecked for range (fuzzing found both of these): a
    subnormal measured time overflowed the relative error, and a batch size of 2**63 - 1
    rounded up to 2**63 in float64 and did not cast back to int64."""
    good = sweep[:40]
    odd = [
        dataclasses.replace(good[0], step_gpu_ms=2.2250738585e-313, predicted_step_ms=1.0),
        dataclasses.replace(good[1], step_gpu_ms=1e300, predicted_step_ms=1e300),
        dataclasses.replace(good[2], predicted_step_ms=-1e300),
        dataclasses.replace(good[3], bs=2**63 - 1, num_verify_tokens=2**63 - 1),
    ]
    agg = Aggregates(GAMMA, flush_rows=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for b in [*odd, *good[4:]]:
            agg.update(b)
        snap = agg.snapshot()
    # the step counts as a step; only its implausible time or prediction is left out
    assert int(snap.steps["total"][0][0]) == len(good)
    check_cost_errors(snap.cost["total"], 0, [odd[3], *good[4:]])


# ------------------------------------------------------ 5. label cardinality


def test_workload_cap_bounds_every_family(mixed):
    """10,000 workload names: the first batch's 16 keep their series, the rest are `other`."""
    source = mixed[0]
    kept = [f"keep-{i:02d}" for i in range(16)]
    batches, names, fresh, r = [], set(), 0, 0
    while len(names) < 10_000:
        b = source[len(batches) % len(source)]
        wl = []
        for _ in range(b.num_reqs):
            if not batches or r % 5 == 0:
                wl.append(kept[r % 16])
            else:
                wl.append(f"w{fresh % 9984:04d}")
                fresh += 1
            r += 1
        names.update(wl)
        batches.append(
            dataclasses.replace(
                b,
                workload=np.array(wl, dtype=object),
                workload_codes=None,
                workload_names=None,
            )
        )
    assert len(names) == 10_000 and set(batches[0].workload) == set(kept)
    all_names = np.concatenate([b.workload for b in batches])
    overflow = int(np.count_nonzero(~np.isin(all_names.astype(str), kept)))

    agg = Aggregates(GAMMA)
    for b in batches:
        agg.update(b)
    s, _ = parse_exposition(render(agg.snapshot()))
    assert sample(s, "dspark_workload_overflow_total") == overflow
    for name, series in s.items():
        values = {dict(k).get("workload") for k in series} - {None}
        assert len(values) <= 17, name
        assert values <= {*kept, "other"}, name
    steps = s["dspark_request_steps_total"]
    by_workload = defaultdict(float)
    for k, v in steps.items():
        by_workload[dict(k)["workload"]] += v
    assert by_workload.pop("other") == overflow
    assert sum(by_workload.values()) == len(all_names) - overflow


# -------------------------------------------------------------- 6. bad input


def _with(b: StepBatch, **cols) -> StepBatch:
    return dataclasses.replace(b, **cols)


def _edited(b: StepBatch, name: str, index, value) -> StepBatch:
    arr = getattr(b, name).copy()
    arr[index] = value
    return _with(b, **{name: arr})


def test_bad_batches_are_rejected_counted_and_leave_aggregates_alone(mixed):
    good = [b for b in mixed[0] if b.mode == "compact" and b.rank == 0][:30]
    pipe = Pipeline(Aggregates(GAMMA))
    for b in good[:20]:
        assert pipe.ingest(b)
    before = pipe.aggregates.snapshot()
    b = good[20]
    bad = [
        (_edited(b, "verify_len", 0, GAMMA + 2), "window_out_of_range"),
        (_edited(b, "verify_len", 1, GAMMA + 3), "window_out_of_range"),
        (_with(b, gamma=GAMMA - 2), "gamma_mismatch"),
        (_edited(b, "correct_drafts", 2, -1), "accepted_out_of_range"),
        (_edited(b, "survival", (0, 3), 1.5), "probability_out_of_range"),
        (_edited(b, "survival", (4, 0), -0.25), "probability_out_of_range"),
    ]
    for batch, _ in bad:
        assert pipe.ingest(batch, source="feed") is False
    after = pipe.aggregates.snapshot()
    records, errors = pipe.stats.snapshot()[:2]
    assert errors == {
        ("feed", "window_out_of_range"): 2,
        ("feed", "gamma_mismatch"): 1,
        ("feed", "accepted_out_of_range"): 1,
        ("feed", "probability_out_of_range"): 2,
    }
    assert records == {"runtime": 20}

    def arrays(snap):
        yield from (snap.tokens[t] for t in ("total", "window"))
        yield from (snap.steps[t] for t in ("total", "window"))
        for part in ("confidence", "cost"):
            for t in ("total", "window"):
                yield from getattr(snap, part)[t].values()
        yield from snap.reliability.values()
        yield from (r.coef for r in snap.refits if r is not None)

    for x, y in zip(arrays(before), arrays(after), strict=True):
        np.testing.assert_array_equal(x, y)
    assert before.groups == after.groups and before.step_groups == after.step_groups
    no_ingest = [line for line in render(after).splitlines() if "dspark_ingest" not in line]
    assert no_ingest == [
        line for line in render(before).splitlines() if "dspark_ingest" not in line
    ]
    s, _ = parse_exposition(render(after, pipe.stats))
    assert sample(s, "dspark_ingest_errors_total", source="feed", reason="gamma_mismatch") == 1
    assert sample(s, "dspark_ingest_records_total", source="runtime") == 20
    # and the pipeline carries on
    assert pipe.ingest(good[21])
