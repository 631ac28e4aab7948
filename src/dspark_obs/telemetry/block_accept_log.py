"""SGLang's block-accept JSONL, read into columns (the walk over it: estimator.block_accept_walk).

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
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

__all__ = [
    "MAX_LINE_BYTES",
    "BlockAcceptLog",
    "default_workload_of",
    "read_block_accept_jsonl",
]

_MAX_BAD_SAMPLES = 20
#: Longest line read: a row holds at most gamma (<= 64) tail tokens and log-probabilities
#: and a few walk entries per open block, a few kilobytes. A longer line is skipped
#: without being held in memory (read in pieces of this size), and counted as bad.
MAX_LINE_BYTES = 1 << 20
#: A log-probability above this is no log-probability (float32 rounding stays far below).
_MAX_LOG_PROB = 1e-3


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
    #: the block size every kept block spans (given, or most blocks' w + len(tail))
    gamma: int | None = None

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
    # NaN or a huge p_lp makes min(1, exp(p_lp - q_lp)) 1: a token accepted for no reason
    if line.pg is not None and any(not entry[2] <= _MAX_LOG_PROB for entry in line.pg):
        return "pg p_lp is NaN or above 0 (not a log-probability)"
    if line.q_lp is not None and any(math.isnan(q) or q == math.inf for q in line.q_lp):
        return "q_lp is NaN or +Infinity (not a log-probability)"
    return None


def _oversized(n: int) -> str:
    return f"line longer than {MAX_LINE_BYTES} bytes ({n} read before skipping the rest)"


def _read_lines(fh) -> Iterable[bytes | int]:
    """The file's lines, or for a line over `MAX_LINE_BYTES` the bytes it had (skipped)."""
    while line := fh.readline(MAX_LINE_BYTES + 1):
        if len(line) <= MAX_LINE_BYTES or line.endswith(b"\n"):
            yield line
            continue
        n = len(line)
        while (piece := fh.readline(MAX_LINE_BYTES)) and not piece.endswith(b"\n"):
            n += len(piece)
        yield n + len(piece)


def _iter_lines(source: str | os.PathLike | Iterable[str | bytes]) -> Iterable[bytes | int]:
    if isinstance(source, str | os.PathLike):
        with Path(source).open("rb") as fh:
            yield from _read_lines(fh)
        return
    for item in source:
        raw = item.encode() if isinstance(item, str) else bytes(item)
        yield raw if len(raw) <= MAX_LINE_BYTES + 1 else len(raw)


def read_block_accept_jsonl(
    source: str | os.PathLike | Iterable[str | bytes],
    gamma: int | None = None,
) -> BlockAcceptLog:
    """Parse the whole file; damage is counted, never raised.

    The recorder flushes every 16 steps and a server can die mid-write, so a
    partial last line is expected, and a file may start after blocks opened
    (rotation) or be concatenated with a replay: such lines and entries land in
    the counters instead of aborting the analysis. A `str` is a path; to parse
    text, pass an iterable of lines (e.g. `text.splitlines()`).

    The file has no gamma field: every block's tail spans w+1..gamma, so it is
    implied. A line that contradicts `gamma` (given, else the value most blocks
    imply) is a bad line too: a block whose w + len(trimmed_tokens) differs, a row
    whose window exceeds it. Memory is bounded per line (`MAX_LINE_BYTES`).
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

    row_line: list[int] = []

    def refuse(lineno: int, reason: str) -> None:
        nonlocal bad
        bad += 1
        if len(samples) < _MAX_BAD_SAMPLES:
            samples.append((lineno, reason))

    for lineno, raw in enumerate(_iter_lines(source), start=1):
        n_lines += 1
        if isinstance(raw, int):
            refuse(lineno, _oversized(raw))
            continue
        if not raw.strip():
            continue
        try:
            line = _decode(raw)
            reason = _check(line)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
        except RecursionError:
            reason = "JSON nested too deeply"
        if reason is not None:
            refuse(lineno, reason)
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
        row_line.append(lineno)
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

    implied = [w + len(t) for w, t in zip(b_w, tails, strict=True)]
    if gamma is None and implied:
        gamma = Counter(implied).most_common(1)[0][0]
    if gamma is not None:  # drop the lines that contradict it, counted with their line
        block_of_row = {index: blocks[key] for key, index in rows.items() if key in blocks}
        drop = []
        for index, w in enumerate(row_cols["w"]):
            b = block_of_row.get(index)
            if w > gamma:
                drop.append((index, f"window w={w} exceeds gamma={gamma}"))
            elif b is not None and implied[b] != gamma:
                drop.append((index, f"w + len(trimmed_tokens) = {implied[b]}, not gamma={gamma}"))
        for index, reason in drop:
            refuse(row_line[index], reason)
        if drop:
            gone = {index for index, _ in drop}
            keep = [i for i in range(len(row_line)) if i not in gone]
            row_cols = {name: [col[i] for i in keep] for name, col in row_cols.items()}
            kept_blocks = [b for b in range(len(b_fct)) if implied[b] == gamma]
            b_rid, b_fct, b_w = ([col[b] for b in kept_blocks] for col in (b_rid, b_fct, b_w))
            tails, qs = [tails[b] for b in kept_blocks], [qs[b] for b in kept_blocks]
            blocks = {(r, f): i for i, (r, f) in enumerate(zip(b_rid, b_fct, strict=True))}

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
        bad_line_samples=tuple(sorted(samples)[:_MAX_BAD_SAMPLES]),
        gamma=gamma,
    )
