"""The sampled-walk ceiling estimate, read back from SGLang's block-accept JSONL.

SGLang 0.5.23 writes one JSON object per sampled request-step when
`SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH` is set (module
`dspark_components/dspark_block_accept_estimator.py`). A row whose whole window
was accepted (`cl == w < gamma`) opens a *block*: it carries the unverified tail
(`trimmed_tokens`, the drafts at offsets w+1..gamma) and the draft's
log-probabilities of those tokens (`q_lp`). Later rows of the same request carry
`pg` entries `[block_fct, offset, p_lp, token, realized]`: the target's
log-probability of the tail token at that offset, gathered while the committed
tokens still equal the tail (so the context is the one the tail was drafted in).
The first entry, at offset w+1, is written by the opening row itself (its bonus
token sits there). A marker `{"rid", "eos_end": [block_fct, ...]}` names the
blocks still pending when the request stopped naturally.

Offsets are 1-based draft positions: accepting offset o means o drafts were
accepted. Rejection sampling would accept the tail token at offset o with
probability a_o = min(1, exp(p_lp - q_lp)), independently given the tokens, so
along a walk of k entries the number N of tail drafts full verification would
have accepted has P(N >= m) = P_m = prod_{i<=m} a_i, mean sum_m P_m and variance
sum_m (2m-1) P_m - (sum_m P_m)^2 (N = sum_m 1[N >= m], and the product of two
such indicators is the one with the larger m).

Units: everything here is in ACCEPTED DRAFTS, the quantity cap-accept mode
reports as `correct_drafts + cap_trim`: lo = w + sum_m P_m. SGLang's own online
aggregate (`_OnlineCeiling`, logged as "uncapped-acc-len") reports accept
LENGTH, which counts the bonus token: SGLang's lo/hi = ours + 1, per block and
for every mean.

Bounds per block follow SGLang's `_finalize_walk_online`,
`_finalize_at_end_online` and `_finalize_eos_online`, with `prod` the running
product after the last walked entry and `unreached = gamma - w - walked`:

- `resolved`: the walk diverged (realized != token; SGLang still counts that
  entry's a before stopping, since the token could have been accepted even
  though the target sampled something else) or reached offset gamma.
  hi = lo + prod * (gamma - last walked offset), which is 0 when exhausted.
- `eos`: the request stopped naturally with the block pending. Nothing beyond
  the stop was ever going to be committed, so SGLang takes lo for both bounds.
- `open`: the file ended (or SGLang dropped the block on a sequence-length
  discontinuity, which the file cannot tell apart) first: censored, hi =
  lo + prod * (gamma - next_offset + 1), as SGLang drains pending blocks.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

__all__ = [
    "BlockAcceptLog",
    "Extrapolate",
    "default_workload_of",
    "read_block_accept_jsonl",
    "summarize_by_workload",
    "tail_acceptance_rates",
    "walk_blocks",
]

RESOLVED, EOS, OPEN = "resolved", "eos", "open"

#: `extrapolate(positions_start, n_blocks) -> expected extra accepted drafts`, per block.
Extrapolate = Callable[[np.ndarray, int], np.ndarray]

_MAX_BAD_SAMPLES = 20


class _Line(msgspec.Struct):
    """Union of a row and a marker; which one it is gets decided after decoding."""

    rid: str
    fct: int | None = None
    w: int | None = None
    cl: int | None = None
    ct: int | None = None
    trimmed_tokens: list[int] | None = None
    q_lp: list[float] | None = None
    pg: list[tuple[int, int, float, int, int]] | None = None
    eos_end: list[int] | None = None


_DECODER = msgspec.json.Decoder(_Line)


def default_workload_of(rid: str) -> str:
    """`WORKLOAD-N` rids: the workload is everything before the last '-'."""
    head, sep, _ = rid.rpartition("-")
    return head if sep else rid


@dataclass(frozen=True, eq=False)
class BlockAcceptLog:
    """The file as columns, so the walk can be done as array work over all blocks.

    Blocks (one per opening row, keyed by (rid, block_fct)): `block_*`, with the
    ragged tails in CSR form (`tail_indptr`, length n_blocks + 1). Walk entries
    (`entry_*`) are already matched to their block, de-duplicated and range
    checked. Rows (`row_*`) are every request-step line, kept because rows that
    did not open a block carry an exact ceiling (cl + ct) that an all-steps mean
    needs. The counters say how much of the file could not be used, and why.
    """

    block_rid: np.ndarray
    block_fct: np.ndarray
    block_window: np.ndarray
    block_eos: np.ndarray
    tail_indptr: np.ndarray
    tail_tokens: np.ndarray
    tail_q_lp: np.ndarray
    entry_block: np.ndarray
    entry_offset: np.ndarray
    entry_p_lp: np.ndarray
    entry_token: np.ndarray
    entry_realized: np.ndarray
    entry_fct: np.ndarray
    row_rid: np.ndarray
    row_fct: np.ndarray
    row_window: np.ndarray
    row_cl: np.ndarray
    row_ct: np.ndarray
    row_opens: np.ndarray
    n_lines: int
    n_markers: int
    bad_lines: int
    duplicate_rows: int
    orphan_entries: int
    out_of_range_entries: int
    duplicate_entries: int
    token_mismatches: int
    unknown_eos: int
    bad_line_samples: tuple[tuple[int, str], ...]

    @property
    def n_blocks(self) -> int:
        return len(self.block_fct)

    @property
    def n_rows(self) -> int:
        return len(self.row_fct)

    @property
    def counts(self) -> dict[str, int]:
        return {
            "lines": self.n_lines,
            "rows": self.n_rows,
            "blocks": self.n_blocks,
            "entries": len(self.entry_block),
            "markers": self.n_markers,
            "bad_lines": self.bad_lines,
            "duplicate_rows": self.duplicate_rows,
            "orphan_entries": self.orphan_entries,
            "out_of_range_entries": self.out_of_range_entries,
            "duplicate_entries": self.duplicate_entries,
            "token_mismatches": self.token_mismatches,
            "unknown_eos": self.unknown_eos,
        }


def _decode(raw: bytes) -> _Line:
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError:
        # json.dumps (what SGLang writes with) emits -Infinity/NaN for a log-prob
        # of a masked token; msgspec refuses those literals, the stdlib does not.
        if b"Infinity" not in raw and b"NaN" not in raw:
            raise
        return msgspec.convert(json.loads(raw), _Line)


_INT64 = (-(2**63), 2**63 - 1)


def _ints(line: _Line) -> Iterable[int]:
    yield from (v for v in (line.fct, line.w, line.cl, line.ct) if v is not None)
    yield from line.trimmed_tokens or ()
    yield from line.eos_end or ()
    for bfct, offset, _, token, realized in line.pg or ():
        yield from (bfct, offset, token, realized)


def _check(line: _Line) -> str | None:
    """Why a decoded line cannot be used, or None; SGLang's own invariants."""
    lo, hi = _INT64
    if not all(lo <= v <= hi for v in _ints(line)):
        # JSON integers are unbounded; the columns below are int64
        return "integer outside int64"
    if line.eos_end is not None:
        if line.fct is not None or line.pg is not None or line.trimmed_tokens is not None:
            return "eos_end marker mixed with row fields"
        return None
    if line.fct is None or line.w is None or line.cl is None or line.ct is None:
        return "row lacks one of fct/w/cl/ct"
    if line.w < 0 or not 0 <= line.cl <= line.w or line.ct < 0:
        return "row violates 0 <= cl <= w, ct >= 0"
    has_tail, has_q = line.trimmed_tokens is not None, line.q_lp is not None
    if has_tail != has_q:
        return "trimmed_tokens without q_lp (or the reverse)"
    if has_tail:
        if len(line.trimmed_tokens) == 0 or len(line.trimmed_tokens) != len(line.q_lp):
            return "trimmed_tokens and q_lp differ in length or are empty"
        if line.cl != line.w:
            return "block opened by a row with cl != w"
    if line.pg is not None and any(entry[1] < 1 for entry in line.pg):
        return "pg offset < 1"
    return None


def _iter_lines(source: str | os.PathLike | Iterable[str | bytes]) -> Iterable[bytes]:
    if isinstance(source, str | os.PathLike):
        with Path(source).open("rb") as fh:
            yield from fh
        return
    for item in source:
        yield item.encode() if isinstance(item, str) else bytes(item)


def read_block_accept_jsonl(
    source: str | os.PathLike | Iterable[str | bytes],
) -> BlockAcceptLog:
    """Parse the whole file; damage is counted, never raised.

    The recorder flushes every 16 steps and a server can die mid-write, so a
    partial last line is expected, and a file may start after blocks opened
    (rotation) or be concatenated with a replay: such lines and entries land in
    the counters instead of aborting the analysis. A `str` is a path; to parse
    text, pass an iterable of lines (e.g. `text.splitlines()`).
    """
    rows: dict[tuple[str, int], int] = {}
    row_cols: dict[str, list] = {k: [] for k in ("rid", "fct", "w", "cl", "ct", "opens")}
    blocks: dict[tuple[str, int], int] = {}
    b_rid: list[str] = []
    b_fct: list[int] = []
    b_w: list[int] = []
    tails: list[list[int]] = []
    qs: list[list[float]] = []
    raw_entries: list[tuple[str, int, int, float, int, int, int]] = []
    markers: list[tuple[str, int]] = []
    n_lines = bad = dup_rows = n_markers = 0
    samples: list[tuple[int, str]] = []

    for lineno, raw in enumerate(_iter_lines(source), start=1):
        n_lines += 1
        if not raw.strip():
            continue
        try:
            line = _decode(raw)
            reason = _check(line)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        if reason is not None:
            bad += 1
            if len(samples) < _MAX_BAD_SAMPLES:
                samples.append((lineno, reason))
            continue
        if line.eos_end is not None:
            n_markers += 1
            markers.extend((line.rid, int(f)) for f in line.eos_end)
            continue
        key = (line.rid, line.fct)
        if key in rows:
            dup_rows += 1
            continue
        rows[key] = len(row_cols["fct"])
        opens = line.trimmed_tokens is not None
        for name, value in zip(
            row_cols, (line.rid, line.fct, line.w, line.cl, line.ct, opens), strict=True
        ):
            row_cols[name].append(value)
        if opens:
            blocks[key] = len(b_fct)
            b_rid.append(line.rid)
            b_fct.append(line.fct)
            b_w.append(line.w)
            tails.append(line.trimmed_tokens)
            qs.append(line.q_lp)
        for bfct, offset, p_lp, token, realized in line.pg or ():
            raw_entries.append((line.rid, bfct, offset, p_lp, token, realized, line.fct))

    window = np.asarray(b_w, dtype=np.int64)
    tail_len = np.asarray([len(t) for t in tails], dtype=np.int64)
    indptr = np.zeros(len(tails) + 1, dtype=np.int64)
    np.cumsum(tail_len, out=indptr[1:])
    tail_tokens = np.asarray([t for tail in tails for t in tail], dtype=np.int64)
    tail_q = np.asarray([q for qlp in qs for q in qlp], dtype=np.float64)

    # Entries may precede their block in a reordered file, so match them only now.
    kept: list[tuple[int, int, float, int, int, int]] = []
    seen: set[tuple[int, int]] = set()
    orphan = out_of_range = dup_entries = mismatch = 0
    for rid, bfct, offset, p_lp, token, realized, fct in raw_entries:
        b = blocks.get((rid, bfct))
        if b is None:
            orphan += 1
            continue
        if not window[b] < offset <= window[b] + tail_len[b]:
            out_of_range += 1
            continue
        if (b, offset) in seen:
            dup_entries += 1
            continue
        seen.add((b, offset))
        if tail_tokens[indptr[b] + offset - window[b] - 1] != token:
            mismatch += 1
        kept.append((b, offset, p_lp, token, realized, fct))

    eos = np.zeros(len(b_fct), dtype=bool)
    unknown_eos = 0
    for key in markers:
        b = blocks.get(key)
        if b is None:
            unknown_eos += 1
        else:
            eos[b] = True

    ent = list(zip(*kept, strict=True)) if kept else [()] * 6
    return BlockAcceptLog(
        block_rid=np.asarray(b_rid, dtype=np.str_),
        block_fct=np.asarray(b_fct, dtype=np.int64),
        block_window=window,
        block_eos=eos,
        tail_indptr=indptr,
        tail_tokens=tail_tokens,
        tail_q_lp=tail_q,
        entry_block=np.asarray(ent[0], dtype=np.int64),
        entry_offset=np.asarray(ent[1], dtype=np.int64),
        entry_p_lp=np.asarray(ent[2], dtype=np.float64),
        entry_token=np.asarray(ent[3], dtype=np.int64),
        entry_realized=np.asarray(ent[4], dtype=np.int64),
        entry_fct=np.asarray(ent[5], dtype=np.int64),
        row_rid=np.asarray(row_cols["rid"], dtype=np.str_),
        row_fct=np.asarray(row_cols["fct"], dtype=np.int64),
        row_window=np.asarray(row_cols["w"], dtype=np.int64),
        row_cl=np.asarray(row_cols["cl"], dtype=np.int64),
        row_ct=np.asarray(row_cols["ct"], dtype=np.int64),
        row_opens=np.asarray(row_cols["opens"], dtype=bool),
        n_lines=n_lines,
        n_markers=n_markers,
        bad_lines=bad,
        duplicate_rows=dup_rows,
        orphan_entries=orphan,
        out_of_range_entries=out_of_range,
        duplicate_entries=dup_entries,
        token_mismatches=mismatch,
        unknown_eos=unknown_eos,
        bad_line_samples=tuple(samples),
    )


def _gamma_of(log: BlockAcceptLog, gamma: int | None) -> int | None:
    """The file has no gamma field; every tail spans w+1..gamma, so it is implied."""
    implied = np.unique(log.block_window + np.diff(log.tail_indptr))
    if gamma is None:
        if len(implied) > 1:
            raise ValueError(f"blocks imply different gammas {implied.tolist()}; pass gamma")
        return int(implied[0]) if len(implied) else None
    if len(implied) and (len(implied) > 1 or implied[0] != gamma):
        raise ValueError(f"gamma={gamma} but the blocks' w + len(tail) are {implied.tolist()}")
    return gamma


@dataclass(frozen=True)
class _Walk:
    """Per-block walk over an (n_blocks, gamma) grid; column c is offset c + 1."""

    a: np.ndarray
    walked: np.ndarray
    survival: np.ndarray
    diverged: np.ndarray


def _walk(log: BlockAcceptLog, gamma: int) -> _Walk:
    n = log.n_blocks
    w = log.block_window
    cols = np.arange(gamma)
    in_tail = cols[None, :] >= w[:, None]

    q = np.full((n, gamma), np.nan)
    tail_len = np.diff(log.tail_indptr)
    tail_row = np.repeat(np.arange(n), tail_len)
    within = np.arange(len(log.tail_q_lp)) - np.repeat(log.tail_indptr[:-1], tail_len)
    q[tail_row, w[tail_row] + within] = log.tail_q_lp

    b, c = log.entry_block, log.entry_offset - 1
    have = np.zeros((n, gamma), dtype=bool)
    have[b, c] = True
    match = np.ones((n, gamma), dtype=bool)
    match[b, c] = log.entry_token == log.entry_realized
    a = np.ones((n, gamma))
    with np.errstate(invalid="ignore", over="ignore"):
        log_ratio = np.minimum(0.0, log.entry_p_lp - q[b, c])
    # SGLang computes min(1.0, exp(x)) in Python, which yields 1.0 for x = NaN.
    a[b, c] = np.where(np.isnan(log_ratio), 1.0, np.exp(log_ratio))

    # The walk is the contiguous run of entries from offset w+1 that stops right
    # after the first divergence; anything past a gap or a divergence is unusable.
    contiguous = np.logical_and.accumulate(have | ~in_tail, axis=1) & in_tail
    diverging = have & ~match & in_tail
    diverged_before = np.zeros_like(diverging)
    diverged_before[:, 1:] = np.logical_or.accumulate(diverging, axis=1)[:, :-1]
    walked = contiguous & ~diverged_before
    survival = np.cumprod(np.where(walked, a, np.where(in_tail, 0.0, 1.0)), axis=1)
    return _Walk(
        a=a,
        walked=walked,
        survival=survival,
        diverged=(walked & diverging).any(axis=1),
    )


def tail_acceptance_rates(
    log: BlockAcceptLog, gamma: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The file's own per-position conditional acceptance rate, `rates[offset - 1]`.

    The default extrapolation for positions a walk never reached. It is the mean
    a over every walked entry at that offset, i.e. conditional on the walk having
    got there; entries are weighted equally, not by their block's survival, and
    walks that reach deep offsets are those whose committed tokens kept matching,
    which favours confident contexts, so deep rates lean optimistic. Offsets with
    no walked entry fall back to the pooled mean over all entries (0 if none).
    Returns (rates, entries per offset).
    """
    gamma = _gamma_of(log, gamma)
    if gamma is None:
        raise ValueError("no blocks in the log; pass gamma")
    walk = _walk(log, gamma)
    counts = walk.walked.sum(axis=0)
    sums = np.where(walk.walked, walk.a, 0.0).sum(axis=0)
    pooled = sums.sum() / counts.sum() if counts.sum() else 0.0
    with np.errstate(invalid="ignore", divide="ignore"):
        rates = np.where(counts > 0, sums / counts, pooled)
    return rates, counts


def _expected_extra_from(rates: np.ndarray) -> np.ndarray:
    """E[s - 1] = expected accepted drafts from offset s on, given s-1 accepted (s = 1..gamma+1)."""
    gamma = len(rates)
    out = np.zeros(gamma + 1)
    for s in range(gamma - 1, -1, -1):
        out[s] = rates[s] * (1.0 + out[s + 1])
    return out


def walk_blocks(
    log: BlockAcceptLog,
    gamma: int | None = None,
    extrapolate: Extrapolate | np.ndarray | None = None,
    *,
    workload_of: Callable[[str], str] | None = None,
) -> dict[str, np.ndarray]:
    """Bounds, point estimate and walk variance per block, in accepted drafts.

    `gamma` may be omitted when the blocks agree on it; a value they contradict
    raises, because every bound would silently be wrong. `extrapolate` fills the
    positions the walk never reached in the point estimate: either a callable
    `f(positions_start, n_blocks)` given the 1-based first unreached offset per
    block (gamma + 1 where none), returning the expected accepted drafts from
    there on given all before it accepted, or per-offset conditional rates
    `rates[offset - 1]` (length gamma). Default: `tail_acceptance_rates` of this
    file. Whatever it returns is clipped to [0, unreached] so lo <= point <= hi
    holds by construction; eos blocks have nothing unreached.

    `var` is the variance of the accepted tail drafts over the walked positions
    only; the unreached positions are covered by the lo/hi bracket instead.
    """
    gamma = _gamma_of(log, gamma)
    wl_of = workload_of or default_workload_of
    rid = log.block_rid
    workload = np.asarray([wl_of(str(r)) for r in rid], dtype=np.str_)
    n = log.n_blocks
    w = log.block_window.astype(np.float64)
    if gamma is None:  # no blocks at all
        empty = np.zeros(0)
        return {
            "rid": rid,
            "block_fct": log.block_fct,
            "workload": workload,
            "window": log.block_window,
            "lo": empty,
            "point": empty,
            "hi": empty,
            "var": empty,
            "status": np.zeros(0, dtype=np.str_),
            "walked": np.zeros(0, dtype=np.int64),
            "prod": empty,
            "unreached": np.zeros(0, dtype=np.int64),
        }

    walk = _walk(log, gamma)
    walked_n = walk.walked.sum(axis=1)
    p_walked = np.where(walk.walked, walk.survival, 0.0)
    lo_extra = p_walked.sum(axis=1)
    m = np.arange(1, gamma + 1)[None, :] - log.block_window[:, None]
    var = np.maximum(0.0, ((2 * m - 1) * p_walked).sum(axis=1) - lo_extra**2)
    last = log.block_window + walked_n - 1
    prod = np.where(walked_n > 0, walk.survival[np.arange(n), np.clip(last, 0, None)], 1.0)

    resolved = walk.diverged | (log.block_window + walked_n == gamma)
    status = np.where(resolved, RESOLVED, np.where(log.block_eos, EOS, OPEN))
    unreached = np.where(status == EOS, 0, gamma - log.block_window - walked_n)
    start = log.block_window + walked_n + 1

    if extrapolate is None or not callable(extrapolate):
        rates = (
            tail_acceptance_rates(log, gamma)[0]
            if extrapolate is None
            else np.asarray(extrapolate, dtype=np.float64)
        )
        if rates.shape != (gamma,):
            raise ValueError(f"rates must have shape ({gamma},), got {rates.shape}")
        extra = _expected_extra_from(np.clip(rates, 0.0, 1.0))[start - 1]
    else:
        extra = np.asarray(extrapolate(start, n), dtype=np.float64)
        if extra.shape != (n,):
            raise ValueError(f"extrapolate must return shape ({n},), got {extra.shape}")
    extra = np.clip(np.nan_to_num(extra, nan=0.0), 0.0, unreached)

    lo = w + lo_extra
    return {
        "rid": rid,
        "block_fct": log.block_fct,
        "workload": workload,
        "window": log.block_window,
        "lo": lo,
        "point": lo + prod * extra,
        "hi": lo + prod * unreached,
        "var": var,
        "status": status,
        "walked": walked_n,
        "prod": prod,
        "unreached": unreached,
    }


def _interval(lo: np.ndarray, point: np.ndarray, hi: np.ndarray, var: np.ndarray, z: float):
    n = len(lo)
    se = math.sqrt(float(var.sum())) / n
    mean_lo, mean_hi = float(lo.mean()), float(hi.mean())
    return {
        "mean_lo": mean_lo,
        "mean_point": float(point.mean()),
        "mean_hi": mean_hi,
        "se": se,
        "ci_lo": mean_lo - z * se,
        "ci_hi": mean_hi + z * se,
    }


def summarize_by_workload(
    blocks: dict[str, np.ndarray],
    workload_of: Callable[[str], str] | None = None,
    *,
    log: BlockAcceptLog | None = None,
    z: float = 1.96,
) -> dict[str, dict[str, Any]]:
    """Per-workload means with an interval meant to cover the realized mean ceiling.

    The interval [mean lo - z*se, mean hi + z*se], se = sqrt(sum var) / n, widens
    the lo/hi bracket (what the unreached positions could add) by the sampling
    noise of the walked positions, so it should cover the mean of cap-accept's
    `correct_drafts + cap_trim` over the same censored steps. With `log`, an
    `all_steps` entry adds the rows that opened no block, whose ceiling is exact
    (cl + ct): that mean is the one comparable to a cap-accept run's overall
    mean, and (+1) to SGLang's cumulative online estimate. Without
    `workload_of`, the walk's `workload` column is used.
    """
    if workload_of is None:
        workload = blocks["workload"]
    else:
        workload = np.asarray([workload_of(str(r)) for r in blocks["rid"]], dtype=np.str_)
    status = blocks["status"]
    out: dict[str, dict[str, Any]] = {}
    for wl in sorted(set(workload.tolist())):
        sel = workload == wl
        stats: dict[str, Any] = {
            "blocks": int(sel.sum()),
            "resolved": int((status[sel] == RESOLVED).sum()),
            "eos": int((status[sel] == EOS).sum()),
            "open": int((status[sel] == OPEN).sum()),
            "mean_window": float(blocks["window"][sel].mean()),
        }
        stats.update(
            _interval(
                blocks["lo"][sel], blocks["point"][sel], blocks["hi"][sel], blocks["var"][sel], z
            )
        )
        out[wl] = stats
    if log is None:
        return out

    known = dict(zip(blocks["rid"].tolist(), workload.tolist(), strict=True))
    wl_of = workload_of or default_workload_of
    exact = ~log.row_opens
    row_wl = np.asarray([known.get(r) or wl_of(r) for r in log.row_rid.tolist()], dtype=np.str_)
    exact_ceiling = (log.row_cl + log.row_ct).astype(np.float64)
    for wl in sorted(set(row_wl[exact].tolist()) | set(out)):
        sel_b = workload == wl
        sel_r = exact & (row_wl == wl)
        ceil = exact_ceiling[sel_r]
        zeros = np.zeros(len(ceil))
        steps = _interval(
            np.concatenate([blocks["lo"][sel_b], ceil]),
            np.concatenate([blocks["point"][sel_b], ceil]),
            np.concatenate([blocks["hi"][sel_b], ceil]),
            np.concatenate([blocks["var"][sel_b], zeros]),
            z,
        )
        steps = {"steps": int(sel_b.sum() + sel_r.sum()), "exact_steps": int(sel_r.sum()), **steps}
        out.setdefault(wl, {"blocks": 0, "resolved": 0, "eos": 0, "open": 0})["all_steps"] = steps
    return out
