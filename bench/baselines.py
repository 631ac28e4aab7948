"""SGLang-style baselines: the same work done the way SGLang's own DSpark observers do it.

SGLang's observers (the step-record dump, the in-band block-accept estimator,
the calibration and step-time loggers) turn each step's tensors into Python
objects with `.tolist()`, one object per request (`ReqDetail`), and then walk
the requests, and each request's positions or pending blocks, in Python
loops, updating Python counters; they log interval means and reset. Every
benchmark's figure is also reported as a ratio against such an implementation,
measured in the same run on the same input.

Everything here is written for this harness from SGLang's documented behaviour
(`reference/SGLANG_DSPARK.md`), not copied from SGLang. It is plain, reasonable
Python in that style, not a strawman: group ids are cached per step, counters are
flat lists indexed by arithmetic, interval counters are merged into totals once
per interval rather than updated twice, and device-side work stays batched (the
block walker gathers its log-probabilities with one indexed read per step, as
SGLang gathers on the GPU before `.tolist()`).

- `SGLangStyleAggregates`: the per-step live aggregation, computing what
  `Aggregates.update` computes for the live metrics (window / accepted /
  committed / ceiling histograms and trim loss per (workload, mode, rank);
  per-position calibration bins; step-load histograms; cost-model error sums and
  the (bs, M-bin) cells of the refit), fed either from a `StepBatch`
  (`update_batch`: `.tolist()` into per-request records) or from SGLang's
  `dspark_info_record` JSON (`update_json`: `json.loads`, then a loop over
  each record's `reqs` dicts). `check_totals` compares its totals with ours.
- `SGLangStyleBlockAccept`: the block-accept estimator of sampled requests: a
  dict of pending blocks per request keyed by the block's forward_ct, each
  block's offsets walked in Python with `math.exp`, the online `lo` / `hi`
  aggregate (interval and cumulative means).
- `prometheus_client_registry`: the same metric families and series as an
  exposition text, held in `prometheus_client` metrics (what SGLang uses for
  its own metrics), so a scrape is `generate_latest`.
- `per_row_workload_summary`: a per-workload summary (mean window, accepted,
  ceiling, utilisation) computed row by row from `DataFrame.iter_rows`.
"""

from __future__ import annotations

import json
import math
import re
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import polars as pl

from dspark_obs.aggregates import Aggregates
from dspark_obs.aggregates.cost_model import REL_BUCKETS
from dspark_obs.aggregates.steps import COUNT_BUCKETS, QUANTITIES
from dspark_obs.aggregates.tokens import histogram_slices
from dspark_obs.calibration.metrics import EPS_PROB
from dspark_obs.domain.step_cost import (
    DEFAULT_BS_PROBES,
    DEFAULT_M_PROBES,
    M_BIN,
    MAX_STEP_S,
    MIN_STEP_S,
    fit_cell_map,
)
from dspark_obs.telemetry import StepBatch

OTHER = "other"
#: SGLang's calibration binning: 15 equal-width ECE bins, 1,024 AUROC histogram bins.
ECE_BINS = 15
AUROC_BINS = 1024
#: Steps between refits of one (mode, rank)'s cost cells, as the live aggregates.
REFIT_EVERY = 256
#: Workload from an SGLang benchmark rid (`gsm8k-17` -> `gsm8k`).
RID_WORKLOAD = re.compile(r"^(?P<workload>[^-]+)-")

_COUNT_BUCKETS = [float(x) for x in COUNT_BUCKETS]
_REL_BUCKETS = [float(x) for x in REL_BUCKETS]
_ERR_WIDTH = 7 + len(_REL_BUCKETS) + 1  # n, predicted, measured, |err|, err, err^2, rel; buckets
_HIGH = 1.0 - EPS_PROB


@dataclass(slots=True)
class ReqRecord:
    """One request in one step, as SGLang's `ReqDetail` (plus what our aggregates read)."""

    rid: str
    workload: str
    req_pool_index: int
    prefix_len: int
    verify_len: int
    acc_len: int
    correct_drafts: int
    cap_trim: int
    bonus_token: int
    shadow_ceiling: int
    draft_tokens: list | None
    confidence: list | None
    survival: list | None


def req_records(batch: StepBatch) -> list[ReqRecord]:
    """`.tolist()` every column of a step, then one `ReqRecord` per request."""
    n = batch.num_reqs
    none = [None] * n

    def rows(m):
        return none if m is None else m.tolist()

    return [
        ReqRecord(*vals)
        for vals in zip(
            batch.rid.tolist(),
            batch.workload.tolist(),
            batch.req_pool_index.tolist(),
            batch.prefix_len.tolist(),
            batch.verify_len.tolist(),
            batch.acc_len.tolist(),
            batch.correct_drafts.tolist(),
            batch.cap_trim.tolist(),
            batch.bonus_token.tolist(),
            batch.shadow_ceiling.tolist(),
            rows(batch.draft_tokens),
            rows(batch.confidence),
            rows(batch.survival),
            strict=True,
        )
    ]


class _Counters:
    """One interval's counters: flat lists per request group and per step group."""

    def __init__(self) -> None:
        self.tokens: list[list[int]] = []  # per group: the token histograms, then trim loss
        self.conf: list[list[float]] = []  # per group: [pos][label][ECE bin] rows, pred sums; sq
        self.auroc: list[list[int]] = []  # per group: [pos][label][AUROC bin] rows
        self.steps: list[list[float]] = []  # per step group: steps, then per quantity
        self.errors: list[list[float]] = []  # per step group: cost-model error sums

    def merge_into(self, total: _Counters) -> None:
        for name in ("tokens", "conf", "auroc", "steps", "errors"):
            mine, theirs = getattr(self, name), getattr(total, name)
            for g, row in enumerate(mine):
                theirs[g] = [x + y for x, y in zip(theirs[g], row, strict=True)]
                mine[g] = [0] * len(row)


class SGLangStyleAggregates:
    """The live aggregation, a Python object per request per step and a loop over them.

    Interval counters (SGLang logs interval means and resets) are merged into the
    cumulative ones every `window_steps` steps; `totals()` adds the open interval.
    """

    def __init__(self, gamma: int, *, workload_cap: int = 16, window_steps: int = 1024) -> None:
        g = self.gamma = gamma
        self.workload_cap = workload_cap
        self.window_steps = window_steps
        sl = histogram_slices(gamma)
        self.at = {name: s.start for name, s in sl.items()}
        self.tok_width = max(s.stop for s in sl.values()) + 1  # + trim loss
        self.conf_width = g * (4 * ECE_BINS + 1)
        self.auroc_width = g * 2 * AUROC_BINS
        self.step_stride = len(_COUNT_BUCKETS) + 2  # buckets incl. +Inf, then the sum
        self.step_width = 1 + len(QUANTITIES) * self.step_stride
        self.workloads: dict[str, int] = {}
        self.groups: list[tuple[str, str, int]] = []
        self.group_ids: dict[tuple[str, str, int], int] = {}
        self.step_groups: list[tuple[str, int]] = []
        self.step_group_ids: dict[tuple[str, int], int] = {}
        self.cells: list[dict[tuple[int, int], list[float]]] = []
        self.refits: list = []
        self.since_refit: list[int] = []
        self.overflow_rows = 0
        self.overflowed = False
        self.cur = _Counters()
        self.total = _Counters()
        self.interval_steps = 0
        self._gid_cache: dict[tuple[str, int], dict[str, int]] = {}
        self._rid_workload: dict[str, str] = {}

    # -- groups ----------------------------------------------------------------

    def _group(self, workload: str, mode: str, rank: int) -> int:
        if workload != OTHER and workload not in self.workloads:
            if len(self.workloads) < self.workload_cap:
                self.workloads[workload] = len(self.workloads)
            else:
                workload = OTHER
                self.overflowed = True
        key = (workload, mode, rank)
        gid = self.group_ids.get(key)
        if gid is None:
            gid = self.group_ids[key] = len(self.groups)
            self.groups.append(key)
            for c in (self.cur, self.total):
                c.tokens.append([0] * self.tok_width)
                c.conf.append([0.0] * self.conf_width)
                c.auroc.append([0] * self.auroc_width)
        return gid

    def _step_group(self, mode: str, rank: int) -> int:
        key = (mode, rank)
        sg = self.step_group_ids.get(key)
        if sg is None:
            sg = self.step_group_ids[key] = len(self.step_groups)
            self.step_groups.append(key)
            for c in (self.cur, self.total):
                c.steps.append([0.0] * self.step_width)
                c.errors.append([0.0] * _ERR_WIDTH)
            self.cells.append({})
            self.refits.append(None)
            self.since_refit.append(0)
        return sg

    # -- per step ----------------------------------------------------------------

    def update_batch(self, batch: StepBatch) -> None:
        """One step from a `StepBatch`: per-request records built with `.tolist()`."""
        mode, rank = batch.mode, int(batch.rank)
        if batch.num_reqs:
            gids = self._gid_cache.setdefault((mode, rank), {})
            request = self._request
            for r in req_records(batch):
                g = gids.get(r.workload)
                if g is None:
                    g = gids[r.workload] = self._group(r.workload, mode, rank)
                request(
                    g,
                    mode,
                    r.verify_len - 1,
                    r.correct_drafts,
                    r.acc_len,
                    r.cap_trim,
                    r.shadow_ceiling,
                    r.survival,
                )
        self._step(
            mode,
            rank,
            batch.bs if batch.bs >= 0 else batch.num_reqs,
            batch.budget,
            batch.num_verify_tokens,
            batch.verify_tokens_graph_key,
            batch.predicted_step_ms,
            batch.step_gpu_ms if batch.step_gpu_ms is not None else batch.step_cpu_ms,
        )
        self._tick()

    def update_json(self, payload: bytes | str, *, rank: int = 0) -> int:
        """A `dspark_info_record` JSON text: `json.loads`, then record by record, req by req.

        Returns the number of step records folded in.
        """
        info = json.loads(payload)
        env_mode = info["mode"]
        if info["gamma"] != self.gamma:
            raise ValueError(f"gamma {info['gamma']} != {self.gamma}")
        rid_workload = self._rid_workload
        request = self._request
        for rec in info["records"]:
            mode = rec.get("mode") or env_mode
            reqs = rec.get("reqs") or ()
            gids = self._gid_cache.setdefault((mode, rank), {})
            for r in reqs:
                rid = r.get("rid")
                workload = rid_workload.get(rid)
                if workload is None:
                    m = RID_WORKLOAD.search(rid) if rid is not None else None
                    workload = rid_workload[rid] = m.group("workload") if m else OTHER
                g = gids.get(workload)
                if g is None:
                    g = gids[workload] = self._group(workload, mode, rank)
                request(
                    g,
                    mode,
                    r["verify_len"] - 1,
                    r["correct_drafts"],
                    r["acc_len"],
                    r["cap_trim"],
                    -1,  # SGLang's records carry no shadow twin
                    r.get("survival"),
                )
            bs = rec.get("bs", -1)
            gpu = rec.get("step_gpu_ms")
            self._step(
                mode,
                rank,
                bs if bs >= 0 else len(reqs),
                rec.get("budget"),
                rec.get("num_verify_tokens", -1),
                rec.get("verify_tokens_graph_key", -1),
                rec.get("predicted_step_ms"),
                gpu if gpu is not None else rec.get("step_cpu_ms"),
            )
            self._tick()
        return len(info["records"])

    def _request(self, g, mode, w, a, committed, cap_trim, shadow, survival) -> None:
        at = self.at
        tok = self.cur.tokens[g]
        tok[at["window"] + w] += 1
        tok[at["accepted"] + a] += 1
        tok[at["committed"] + committed] += 1
        if mode == "static":
            ceiling = a
        elif mode == "cap-accept":
            ceiling = a + cap_trim
        else:
            ceiling = -1
        if ceiling >= 0:
            known = ceiling
            tok[at["ceiling_observed"] + ceiling] += 1
        elif shadow >= 0:
            known = shadow
            tok[at["ceiling_shadow"] + shadow] += 1
        else:
            known = -1
        if known >= 0:
            tok[at["accepted_known"] + a] += 1
            tok[-1] += known - a if known > a else 0  # trim loss
        if self.overflowed and self.groups[g][0] == OTHER:
            self.overflow_rows += 1
        if survival is None:
            return
        # calibration: label of position j is "the first j+1 drafts were accepted"; a compact
        # row that accepted its whole window labels only the accepted positions
        reach = known if known >= 0 else a
        last = self.gamma if (known >= 0 or a < w) else a
        conf = self.cur.conf[g]
        auroc = self.cur.auroc[g]
        stride = 4 * ECE_BINS + 1
        for j in range(last):
            p = survival[j]
            p = EPS_PROB if p < EPS_PROB else (_HIGH if p > _HIGH else p)
            label = 1 if j < reach else 0
            base = j * stride + label * ECE_BINS + int(p * ECE_BINS)
            conf[base] += 1
            conf[base + 2 * ECE_BINS] += p
            conf[j * stride + 4 * ECE_BINS] += p * p
            auroc[(2 * j + label) * AUROC_BINS + int(p * AUROC_BINS)] += 1

    def _step(self, mode, rank, bs, budget, verify, tier, predicted_ms, measured_ms) -> None:
        sg = self._step_group(mode, rank)
        row = self.cur.steps[sg]
        row[0] += 1
        stride = self.step_stride
        for q, v in enumerate(
            (
                bs,
                budget,
                verify if verify is not None and verify >= 0 else None,
                tier if tier is not None and tier >= 0 else None,
            )
        ):
            if v is None:
                continue
            col = 1 + q * stride
            row[col + bisect_left(_COUNT_BUCKETS, v)] += 1
            row[col + stride - 1] += v
        # cost model: error sums where both prediction and measurement exist
        m = None if measured_ms is None else measured_ms / 1e3
        if m is None or not MIN_STEP_S <= m <= MAX_STEP_S:
            return
        if predicted_ms is not None and abs(predicted_ms / 1e3) <= MAX_STEP_S:
            p = predicted_ms / 1e3
            err = m - p
            rel = abs(err) / m
            e = self.cur.errors[sg]
            e[0] += 1
            e[1] += p
            e[2] += m
            e[3] += abs(err)
            e[4] += err
            e[5] += err * err
            e[6] += rel
            e[7 + bisect_left(_REL_BUCKETS, rel)] += 1
        tokens = verify if verify is not None and verify >= 0 else bs
        if tokens > 0 and bs > 0:
            cell = self.cells[sg].setdefault((bs, tokens // M_BIN), [0.0, 0.0, 0.0])
            cell[0] += 1
            cell[1] += m
            cell[2] += m * m
            self.since_refit[sg] += 1
            if self.since_refit[sg] >= REFIT_EVERY or self.refits[sg] is None:
                self.refits[sg] = fit_cell_map(self.cells[sg], DEFAULT_BS_PROBES, DEFAULT_M_PROBES)
                self.since_refit[sg] = 0

    def _tick(self) -> None:
        """One step done: an interval ends every `window_steps` steps."""
        self.interval_steps += 1
        if self.interval_steps >= self.window_steps:
            self.cur.merge_into(self.total)
            self.interval_steps = 0

    # -- reading -------------------------------------------------------------------

    def totals(self) -> dict[str, list]:
        """Cumulative counters (merged intervals plus the open one), as numpy arrays."""

        def add(name):
            return [
                np.asarray(t) + np.asarray(c)
                for t, c in zip(getattr(self.total, name), getattr(self.cur, name), strict=True)
            ]

        return {name: add(name) for name in ("tokens", "conf", "auroc", "steps", "errors")}


def check_totals(ours: Aggregates, base: SGLangStyleAggregates) -> dict:
    """Assert that the baseline counted what ours counted; returns what was compared.

    Compared exactly, per (workload, mode, rank): request-steps, the sum of accepted
    drafts, the window, committed and ceiling histograms; per position: labelled
    calibration rows and positives; per (mode, rank): steps and cost-model steps.
    """
    snap = ours.snapshot()
    gamma = ours.gamma
    sl = histogram_slices(gamma)
    tot = base.totals()
    ours_groups = {key: i for i, key in enumerate(snap.groups)}
    if set(ours_groups) != set(base.group_ids):
        raise AssertionError(f"groups differ: {sorted(ours_groups)} vs {sorted(base.group_ids)}")
    conf = snap.reliability
    stride = 4 * ECE_BINS + 1
    compared = {"groups": len(ours_groups), "request_steps": 0, "accepted_sum": 0}
    for key, i in ours_groups.items():
        b = base.group_ids[key]
        mine, theirs = snap.tokens["total"][i], tot["tokens"][b]
        for name in ("window", "committed", "ceiling_observed", "ceiling_shadow", "accepted"):
            s = sl[name]
            if not np.array_equal(mine[s], theirs[s]):
                raise AssertionError(f"{key}: {name} histogram {mine[s]} vs {theirs[s]}")
        acc = np.arange(sl["accepted"].stop - sl["accepted"].start)
        ours_acc = int((mine[sl["accepted"]] * acc).sum())
        base_acc = int((theirs[sl["accepted"]] * acc).sum())
        if ours_acc != base_acc:
            raise AssertionError(f"{key}: accepted sum {ours_acc} vs {base_acc}")
        c = tot["conf"][b].reshape(gamma, stride)
        rows = c[:, : 2 * ECE_BINS].sum(axis=1)
        positives = c[:, ECE_BINS : 2 * ECE_BINS].sum(axis=1)
        if not (
            np.array_equal(conf["rows"][i].sum(axis=1), rows)
            and np.array_equal(conf["positives"][i].sum(axis=1), positives)
        ):
            raise AssertionError(f"{key}: calibration rows / positives per position differ")
        compared["request_steps"] += int(mine[sl["window"]].sum())
        compared["accepted_sum"] += ours_acc
    ours_sg = {key: i for i, key in enumerate(snap.step_groups)}
    if set(ours_sg) != set(base.step_group_ids):
        raise AssertionError("step groups differ")
    for key, i in ours_sg.items():
        b = base.step_group_ids[key]
        if int(snap.steps["total"][i][0]) != int(tot["steps"][b][0]):
            raise AssertionError(
                f"{key}: steps {snap.steps['total'][i][0]} vs {tot['steps'][b][0]}"
            )
        if int(snap.cost["total"]["steps"][i]) != int(tot["errors"][b][0]):
            raise AssertionError(f"{key}: cost-model steps differ")
    compared["steps"] = int(sum(snap.steps["total"][:, 0]))
    compared["calibration_rows"] = int(conf["rows"].sum())
    return compared


# -- the block-accept estimator ------------------------------------------------------------


class _Block:
    __slots__ = ("acc", "next", "prefix", "prod", "q_lp", "tail", "window")

    def __init__(self, window, prefix, tail, q_lp) -> None:
        self.window = window
        self.prefix = prefix  # the opening step's prefix_len: draft index k sits at prefix + k
        self.tail = tail  # trimmed tokens (draft indices window..gamma-1)
        self.q_lp = q_lp
        self.next = window + 1  # next offset to walk (1-based over the drafts)
        self.prod = 1.0
        self.acc = 0.0


class SGLangStyleBlockAccept:
    """SGLang's in-band block-accept estimate, the SGLang way.

    Sampled requests only (greedy rows are skipped, as SGLang does). A row that
    accepts its whole window w < gamma opens a block; this step's and later
    steps' committed tokens are compared offset by offset with the block's
    trimmed tokens, `a_i = min(1, exp(p_lp - q_lp))` multiplied along; the walk
    ends at the first mismatch (that offset included) or at gamma, or when the
    request leaves the batch. Per block `lo = w + 1 + sum_j prod_{i<=j} a_i` and
    `hi = lo + prod * (gamma - last offset)`; interval and cumulative means are
    kept (`log_every` steps an interval).

    `p_lp` comes from the verify distributions of the step that committed the
    offset: one indexed read per step, then `.tolist()`, as SGLang gathers on the
    GPU.
    """

    def __init__(self, gamma: int, log_every: int = 256) -> None:
        self.gamma = gamma
        self.log_every = log_every
        self.pending: dict[str, dict[int, _Block]] = {}  # rid -> block forward_ct -> block
        self.steps = 0
        self.opened = 0
        self.closed = 0
        self.interval = [0, 0.0, 0.0]  # blocks, lo sum, hi sum
        self.cumulative = [0, 0.0, 0.0]
        self.logged: list[tuple[float, float]] = []
        self.lo_of: dict[tuple[str, int], float] | None = None  # per block, when asked

    def _close(self, rid: str, fct: int, blk: _Block, last: int) -> None:
        lo = blk.window + 1 + blk.acc
        hi = lo + blk.prod * (self.gamma - last)
        for agg in (self.interval, self.cumulative):
            agg[0] += 1
            agg[1] += lo
            agg[2] += hi
        self.closed += 1
        if self.lo_of is not None:
            self.lo_of[(rid, fct)] = lo

    def update(self, batch: StepBatch, verified: np.ndarray) -> None:
        """One step; `verified[row, position, token]` are the step's verify probabilities."""
        g = self.gamma
        fct = int(batch.forward_ct)
        rids = batch.rid.tolist()
        greedy = batch.greedy.tolist()
        prefix = batch.prefix_len.tolist()
        verify_len = batch.verify_len.tolist()
        correct = batch.correct_drafts.tolist()
        bonus = batch.bonus_token.tolist()
        draft = batch.draft_tokens.tolist()
        q_lp = batch.draft_logprobs.tolist()
        pending = self.pending
        # requests that left the batch close their blocks (SGLang's `eos_end`)
        present = set(rids)
        for rid in [r for r in pending if r not in present]:
            for bfct, blk in pending.pop(rid).items():
                self._close(rid, bfct, blk, blk.next - 1)
        walk = []  # (rid, block fct, block, offset, matched), one per offset walked this step
        rows, idx, toks = [], [], []
        for i, rid in enumerate(rids):
            if greedy[i] == 1:
                continue
            w, cl, p0 = verify_len[i] - 1, correct[i], prefix[i]
            blocks = pending.get(rid)
            if cl == w and w < g:
                if blocks is None:
                    blocks = pending[rid] = {}
                blocks[fct] = _Block(w, p0, draft[i][w:], q_lp[i][w:])
                self.opened += 1
            if not blocks:
                continue
            committed = draft[i][:cl]
            committed.append(bonus[i])
            end = p0 + cl  # last position committed this step
            for bfct, blk in blocks.items():
                o = blk.next
                pos = blk.prefix + o - 1
                while o <= g and p0 <= pos <= end:
                    k = pos - p0
                    token = blk.tail[o - blk.window - 1]
                    matched = committed[k] == token
                    walk.append((rid, bfct, blk, o, matched))
                    rows.append(i)
                    idx.append(k)
                    toks.append(token)
                    o += 1
                    pos += 1
                    if not matched:
                        break
                blk.next = o
        if walk:
            p_lp = np.log(verified[rows, idx, toks]).tolist()
            for (rid, bfct, blk, o, matched), p in zip(walk, p_lp, strict=True):
                a = math.exp(p - blk.q_lp[o - blk.window - 1])
                blk.prod *= a if a < 1.0 else 1.0
                blk.acc += blk.prod
                if not matched or o == g:
                    del pending[rid][bfct]
                    self._close(rid, bfct, blk, o)
        self.steps += 1
        if self.steps % self.log_every == 0:
            n, lo, hi = self.interval
            self.logged.append((lo / n, hi / n) if n else (math.nan, math.nan))
            self.interval = [0, 0.0, 0.0]

    def close(self) -> None:
        for rid, blocks in self.pending.items():
            for bfct, blk in blocks.items():
                self._close(rid, bfct, blk, blk.next - 1)
        self.pending = {}


class SGLangStyleCeilingEstimator(SGLangStyleBlockAccept):
    """The same work as our `CeilingEstimator`, the SGLang way: like for like.

    On top of SGLang's sampled walk: greedy requests' blocks are walked too
    (a tail draft is accepted while it equals the committed token, so no
    log-probability is needed), and every request-step feeds the population
    model's counts per (workload, position, confidence bin): at risk, rejected,
    and the confidence sum and count, plus the unstratified Kaplan-Meier counts,
    each request's positions walked in a Python loop.
    """

    def __init__(self, gamma: int, bins: int = 10, log_every: int = 256) -> None:
        super().__init__(gamma, log_every)
        self.bins = bins
        self.groups: dict[str, int] = {}
        self.counts: dict[tuple[int, int, int], list[float]] = {}  # n, d, conf sum, conf count
        self.km: dict[tuple[int, int], list[int]] = {}  # n, d
        self.greedy_pending: dict[str, dict[int, _Block]] = {}
        self.greedy_closed = 0

    def update(self, batch: StepBatch, verified: np.ndarray) -> None:
        super().update(batch, verified)
        self._greedy_walk(batch)
        g, bins = self.gamma, self.bins
        windows = (batch.verify_len - 1).tolist()
        accepted = batch.correct_drafts.tolist()
        confidence = batch.confidence.tolist()
        for workload, w, a, conf in zip(
            batch.workload.tolist(), windows, accepted, confidence, strict=True
        ):
            grp = self.groups.setdefault(workload, len(self.groups))
            for i in range(g):
                k = min(int(conf[i] * bins), bins - 1)
                cell = self.counts.get((grp, i, k))
                if cell is None:
                    cell = self.counts[(grp, i, k)] = [0, 0, 0.0, 0]
                cell[2] += conf[i]
                cell[3] += 1
                if i <= a and i < w:  # position i verified with every earlier draft accepted
                    cell[0] += 1
                    km = self.km.setdefault((grp, i), [0, 0])
                    km[0] += 1
                    if i == a:
                        cell[1] += 1
                        km[1] += 1

    def _greedy_walk(self, batch: StepBatch) -> None:
        g = self.gamma
        fct = int(batch.forward_ct)
        pending = self.greedy_pending
        for rid, greedy, prefix, w, cl, bonus, draft in zip(
            batch.rid.tolist(),
            batch.greedy.tolist(),
            batch.prefix_len.tolist(),
            (batch.verify_len - 1).tolist(),
            batch.correct_drafts.tolist(),
            batch.bonus_token.tolist(),
            batch.draft_tokens.tolist(),
            strict=True,
        ):
            if greedy != 1:
                continue
            blocks = pending.get(rid)
            if cl == w and w < g:
                if blocks is None:
                    blocks = pending[rid] = {}
                blocks[fct] = _Block(w, prefix, draft[w:], None)
            if not blocks:
                continue
            committed = draft[:cl]
            committed.append(bonus)
            end = prefix + cl
            for bfct in list(blocks):
                blk = blocks[bfct]
                o = blk.next
                pos = blk.prefix + o - 1
                while o <= g and prefix <= pos <= end:
                    if committed[pos - prefix] != blk.tail[o - blk.window - 1]:
                        break
                    blk.acc += 1
                    o += 1
                    pos += 1
                blk.next = o
                if o > g or pos <= end:  # the tail is used up, or a mismatch ended the run
                    del blocks[bfct]
                    self.greedy_closed += 1


# -- the exposition, with prometheus_client ---------------------------------------------------


def prometheus_client_registry(text: bytes | str):
    """A `prometheus_client` registry holding the families and series of exposition `text`.

    Gauges and counters are labelled `Gauge` / `Counter` children set to the
    text's values; histograms are `Histogram` children whose bucket counts and
    sum are set to the text's (prometheus_client has no public setter for those,
    so its per-bucket values are set directly). `_created` series are disabled
    so the series match ours one for one. Each metric is registered through a
    thin collector without `describe`, because prometheus_client refuses a gauge
    `x` beside a counter `x_total` in one registry (both claim the name `x`).
    """
    import prometheus_client as pc
    from prometheus_client.parser import text_string_to_metric_families

    pc.disable_created_metrics()
    reg = pc.CollectorRegistry(auto_describe=False)

    class _Registered:
        def __init__(self, metric) -> None:
            self.collect = metric.collect

    if isinstance(text, bytes):
        text = text.decode()
    for fam in text_string_to_metric_families(text):
        doc = fam.documentation or fam.name
        if fam.type == "histogram":
            series: dict[tuple, dict] = {}
            names: list[str] = []
            for s in fam.samples:
                labels = {k: v for k, v in s.labels.items() if k != "le"}
                names = list(labels)
                key = tuple(labels.values())
                entry = series.setdefault(key, {"buckets": [], "sum": 0.0})
                if s.name.endswith("_bucket"):
                    entry["buckets"].append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_sum"):
                    entry["sum"] = s.value
            bounds = [le for le, _ in next(iter(series.values()))["buckets"]] if series else []
            metric = pc.Histogram(fam.name, doc, names, buckets=bounds, registry=None)
            reg.register(_Registered(metric))
            for key, entry in series.items():
                child = metric.labels(*key) if names else metric
                prev = 0.0
                for (_, cum), bucket in zip(entry["buckets"], child._buckets, strict=True):
                    bucket.set(cum - prev)
                    prev = cum
                child._sum.set(entry["sum"])
        elif fam.type in ("gauge", "counter"):
            # a family with no series yet keeps a label, so that it renders no sample either
            names = list(fam.samples[0].labels) if fam.samples else ["source"]
            cls = pc.Gauge if fam.type == "gauge" else pc.Counter
            metric = cls(fam.name, doc, names, registry=None)
            reg.register(_Registered(metric))
            for s in fam.samples:
                child = metric.labels(*s.labels.values()) if names else metric
                if fam.type == "gauge":
                    child.set(s.value)
                elif s.value:
                    child.inc(s.value)
                else:
                    child.inc(0)
        else:
            raise ValueError(f"{fam.name}: unexpected family type {fam.type}")
    return reg


def exposition_samples(text: bytes | str) -> dict[tuple, float]:
    """Every sample of an exposition text by (name, labels); `le` compared as a number."""
    from prometheus_client.parser import text_string_to_metric_families

    if isinstance(text, bytes):
        text = text.decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = dict(s.labels)
            if "le" in labels:
                labels["le"] = float(labels["le"])
            out[(s.name, tuple(sorted(labels.items())))] = s.value
    return out


def same_samples(a: bytes | str, b: bytes | str) -> int:
    """Assert two exposition texts hold the same samples with the same values; returns how many."""
    sa, sb = exposition_samples(a), exposition_samples(b)
    if set(sa) != set(sb):
        diff = sorted(set(sa) ^ set(sb))[:5]
        raise AssertionError(f"series differ ({len(sa)} vs {len(sb)}), e.g. {diff}")
    for key, x in sa.items():
        y = sb[key]
        if not (x == y or (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-9 * abs(x)):
            raise AssertionError(f"{key}: {x} vs {y}")
    return len(sa)


# -- the per-workload summary, row by row -------------------------------------------------------


def per_row_workload_summary(rows: Iterable[tuple]) -> dict[str, dict]:
    """Per workload from `(workload, window, accepted, ceiling, shadow_ceiling)` rows.

    Mean window, accepted and known ceiling (observed, else the shadow twin's);
    utilisation = accepted / ceiling over rows whose ceiling is known (a ratio of sums).
    """
    acc: dict[str, list] = {}
    for workload, window, accepted, ceiling, shadow in rows:
        a = acc.get(workload)
        if a is None:
            a = acc[workload] = [0, 0, 0, 0, 0, 0]  # rows, window, accepted, known, ceil, acc_known
        a[0] += 1
        a[1] += window
        a[2] += accepted
        known = ceiling if ceiling is not None else shadow
        if known is not None:
            a[3] += 1
            a[4] += known
            a[5] += accepted
    return {
        w: {
            "request_steps": a[0],
            "mean_window": a[1] / a[0],
            "mean_accepted": a[2] / a[0],
            "mean_ceiling": a[4] / a[3] if a[3] else None,
            "utilisation": a[5] / a[4] if a[4] else None,
        }
        for w, a in acc.items()
    }


def polars_workload_summary(df: pl.DataFrame) -> dict[str, dict]:
    """The same summary with polars, to check the row loop against."""
    known = pl.coalesce(pl.col("ceiling"), pl.col("shadow_ceiling"))
    out = (
        df.group_by("workload")
        .agg(
            pl.len().alias("request_steps"),
            pl.col("window").mean().alias("mean_window"),
            pl.col("correct_drafts").mean().alias("mean_accepted"),
            known.mean().alias("mean_ceiling"),
            (pl.col("correct_drafts").filter(known.is_not_null()).sum() / known.sum()).alias(
                "utilisation"
            ),
        )
        .to_dicts()
    )
    return {r.pop("workload"): r for r in out}
