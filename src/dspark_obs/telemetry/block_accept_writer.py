"""SGLang's block-accept JSONL written from a stream of StepBatches (read back by
`block_accept_log`).

SGLang 0.5.23's `BlockAcceptEstimateRecorder` writes the file only from inside a
server. A source whose trajectory has exact truth (the reference runtime with a
cap-accept shadow) writes the same file here, so the walk over it can be held
against that truth. The rules are the recorder's, fed one step at a time as its
`DsparkStepObservers` feeds it (steps with a folded proposal or a greedy draft, which
it skips, do not occur in a StepBatch stream that has draft log-probabilities):

- State is per rid. A row whose `prefix_len` is not the one the request's previous
  row left (`prefix_len + correct_drafts + 1`) drops the request's pending blocks.
- A greedy row drops its request's pending blocks and writes nothing; every sampled
  row writes one line `{rid, fct, w, cl, ct}`.
- A sampled row with `cl == w < gamma` opens a block: `trimmed_tokens` and `q_lp`
  are its drafts and draft log-probabilities at offsets w+1..gamma.
- Every pending block of a sampled row's request (older blocks first, then the one
  it opened) is walked along the tokens the row committed (accepted drafts, then the
  bonus): one `pg` entry `[block_fct, offset, p_lp, token, realized]` per offset
  whose position the row committed, `p_lp` the target's log-probability of the tail
  token there, stopping after the first entry whose realized token differs; a block
  diverged or walked to gamma is done.
- A request that stops naturally (EOS within max_new_tokens) with blocks pending
  gets a marker `{rid, eos_end: [block_fct, ...]}`; any finished request's state goes.
- Every 1024 steps, requests not seen for more than 4096 steps are forgotten.

The per-step work is array work over the step's rows and pending blocks; only the
lines themselves are built per row, as the recorder builds them. Floats are the
source's float64 values, where SGLang writes float32 ones.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TextIO

import numpy as np

from .batch import StepBatch

__all__ = ["BlockAcceptWriter"]

# SGLang's recorder: states unseen for this many steps are dropped, checked this often
_SWEEP_EVERY_STEPS = 1024
_EXPIRE_STEPS = 4096

#: `gather(rows, positions, tokens)`: the target's log-probabilities of `tokens` at
#: verify positions of the step's rows (the pipeline's gather; the runtime's
#: `gather_target_logprobs`).
TargetGather = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


@dataclass
class _Blocks:
    """Pending blocks as columns, in the order they opened (each request's pending order).

    `tail[k, c]` is the draft at offset c + 1 for c >= window, -1 before it.
    """

    req: np.ndarray
    fct: np.ndarray
    anchor: np.ndarray
    window: np.ndarray
    next_offset: np.ndarray
    tail: np.ndarray

    @classmethod
    def empty(cls, gamma: int) -> _Blocks:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, z, z, np.zeros((0, gamma), dtype=np.int64))

    def take(self, sel: np.ndarray) -> _Blocks:
        return _Blocks(*(getattr(self, f.name)[sel] for f in fields(self)))

    def extend(self, other: _Blocks) -> _Blocks:
        return _Blocks(
            *(np.concatenate([getattr(self, f.name), getattr(other, f.name)]) for f in fields(self))
        )


class BlockAcceptWriter:
    """`observe` each step (with the gather of its target log-probabilities), then
    `finished` for the requests that ended in it; `close` at the end."""

    def __init__(self, out: str | os.PathLike | TextIO, gamma: int) -> None:
        if not 1 <= gamma <= 64:
            raise ValueError(f"gamma must be within 1..64, got {gamma}")
        self.gamma = gamma
        if isinstance(out, str | os.PathLike):
            # never over another file: the JSONL is the data, not a cache
            self._file = Path(out).open("x", encoding="utf-8")
            self._owned = True
        else:
            self._file, self._owned = out, False
        self._index: dict[str, int] = {}
        self._rid_of: list[str | None] = []
        self._free: list[int] = []
        self._expected = np.zeros(0, dtype=np.int64)
        self._seen = np.zeros(0, dtype=np.int64)
        self._blocks = _Blocks.empty(gamma)
        self._steps = 0
        self.lines = 0

    def __enter__(self) -> BlockAcceptWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._owned:
            self._file.close()
        else:
            self._file.flush()

    # --- request state --------------------------------------------------------

    def _slots(self, rids: Sequence[str]) -> np.ndarray:
        """Each rid's state slot; a rid seen for the first time gets a fresh one."""
        index = self._index
        slots = [index.get(r, -1) for r in rids]
        for i, s in enumerate(slots):
            if s < 0:
                slots[i] = index[rids[i]] = self._new_slot(rids[i])
        return np.asarray(slots, dtype=np.int64)

    def _new_slot(self, rid: str) -> int:
        if self._free:
            s = self._free.pop()
            self._rid_of[s] = rid
        else:
            s = len(self._rid_of)
            self._rid_of.append(rid)
            if s >= len(self._expected):
                grow = max(64, 2 * len(self._expected))
                self._expected = np.resize(self._expected, grow)
                self._seen = np.resize(self._seen, grow)
        self._expected[s] = -1
        return s

    def _forget(self, slots: np.ndarray) -> None:
        """Drop requests with everything they have pending."""
        self._blocks = self._blocks.take(~np.isin(self._blocks.req, slots))
        for s in slots.tolist():
            del self._index[self._rid_of[s]]
            self._rid_of[s] = None
            self._free.append(s)

    # --- one step -------------------------------------------------------------

    def _check(self, batch: StepBatch) -> None:
        if batch.gamma != self.gamma:
            raise ValueError(f"step gamma {batch.gamma} != the writer's {self.gamma}")
        if batch.num_reqs != batch.bs:
            raise ValueError("the block-accept JSONL needs every request's row")
        if batch.draft_tokens is None or batch.draft_logprobs is None:
            raise ValueError("the block-accept JSONL needs draft tokens and log-probabilities")
        if (batch.greedy < 0).any():
            raise ValueError("the block-accept JSONL needs each row's sampling mode (greedy)")
        if any(not isinstance(r, str) for r in batch.rid):
            raise ValueError("the block-accept JSONL needs a string rid per row")
        if len(set(batch.rid.tolist())) != batch.bs:
            raise ValueError("a rid appears twice in one step")
        w, cl = batch.window, batch.correct_drafts
        if not ((cl >= 0) & (cl <= w) & (w <= self.gamma)).all():
            raise ValueError("a row violates 0 <= correct_drafts <= verify_len - 1 <= gamma")

    def observe(self, batch: StepBatch, gather: TargetGather) -> None:
        """Write the step's lines; `gather` is asked only for positions the step committed."""
        self._check(batch)
        g, bs = self.gamma, batch.bs
        fct = int(batch.forward_ct)
        seq, cl, w = batch.prefix_len, batch.correct_drafts, batch.window
        greedy = batch.greedy == 1
        slots = self._slots(batch.rid.tolist())
        expected = self._expected[slots]
        broken = (expected >= 0) & (seq != expected)
        self._expected[slots] = seq + cl + 1
        self._seen[slots] = fct

        row_of = np.full(len(self._rid_of), -1, dtype=np.int64)
        row_of[slots] = np.arange(bs)
        old = self._blocks
        old_row = row_of[old.req]
        here = old_row >= 0
        dropped = here & (broken | greedy)[np.maximum(old_row, 0)]

        opens = ~greedy & (cl == w) & (w < g)
        o_rows = np.flatnonzero(opens)
        cols = np.arange(g)
        new = _Blocks(
            req=slots[o_rows],
            fct=np.full(len(o_rows), fct, dtype=np.int64),
            anchor=seq[o_rows] - 1,
            window=w[o_rows],
            next_offset=w[o_rows] + 1,
            tail=np.where(cols >= w[o_rows, None], batch.draft_tokens[o_rows], -1),
        )
        walking = here & ~dropped
        blocks = old.take(walking).extend(new)
        rows = np.concatenate([old_row[walking], o_rows])
        # walk each request's blocks in pending order, requests in row order (the lines' order)
        order = np.argsort(rows, kind="stable")
        blocks, rows = blocks.take(order), rows[order]

        committed = np.concatenate([batch.draft_tokens, np.zeros((bs, 1), np.int64)], axis=1)
        committed[np.arange(bs), cl] = batch.bonus_token
        at = blocks.anchor[:, None] + cols + 1 - seq[rows, None]  # verify row of offset c + 1
        reach = (cols + 1 >= blocks.next_offset[:, None]) & (at <= cl[rows, None])
        realized = committed[rows[:, None], np.clip(at, 0, g)]
        differs = reach & (realized != blocks.tail)
        after_diff = np.zeros_like(differs)
        after_diff[:, 1:] = np.logical_or.accumulate(differs, axis=1)[:, :-1]
        walked = reach & ~after_diff
        k, c = np.nonzero(walked)
        tokens = blocks.tail[k, c]
        p_lp = (
            np.asarray(gather(rows[k], at[k, c], tokens), dtype=np.float64)
            if len(k)
            else np.zeros(0)
        )
        blocks.next_offset = blocks.next_offset + walked.sum(axis=1)
        pending = ~(walked & differs).any(axis=1) & (blocks.next_offset <= g)
        kept = blocks.take(pending)
        # back in opening order, blocks of requests not in this step untouched
        self._blocks = old.take(~here).extend(kept.take(np.argsort(kept.fct, kind="stable")))

        entries = list(
            map(
                list,
                zip(
                    blocks.fct[k].tolist(),
                    (c + 1).tolist(),
                    p_lp.tolist(),
                    tokens.tolist(),
                    realized[k, c].tolist(),
                    strict=True,
                ),
            )
        )
        self._write_rows(batch, greedy, opens, entries, np.bincount(rows[k], minlength=bs))
        self._steps += 1
        if self._steps % _SWEEP_EVERY_STEPS == 0:
            self._sweep(fct)

    def _write_rows(self, batch, greedy, opens, entries, per_row) -> None:
        """One line per sampled row, in row order, its fields in the recorder's order."""
        g, fct = self.gamma, int(batch.forward_ct)
        end = np.cumsum(per_row).tolist()
        start = [0, *end[:-1]]
        rid, w = batch.rid.tolist(), batch.window.tolist()
        cl, ct = batch.correct_drafts.tolist(), batch.cap_trim.tolist()
        drafts, q_lp = batch.draft_tokens.tolist(), batch.draft_logprobs.tolist()
        out = []
        for b in np.flatnonzero(~greedy).tolist():
            line = {"rid": rid[b], "fct": fct, "w": w[b], "cl": cl[b], "ct": ct[b]}
            if opens[b]:
                line["trimmed_tokens"] = drafts[b][w[b] : g]
                line["q_lp"] = q_lp[b][w[b] : g]
            if end[b] > start[b]:
                line["pg"] = entries[start[b] : end[b]]
            out.append(json.dumps(line) + "\n")
        self._file.write("".join(out))
        self.lines += len(out)

    def _sweep(self, fct: int) -> None:
        live = np.asarray(list(self._index.values()), dtype=np.int64)
        self._forget(live[fct - self._seen[live] > _EXPIRE_STEPS])

    def finished(self, rids: Sequence[str], natural_stop: Sequence[bool]) -> None:
        """Requests that ended in the step just observed, in the order SGLang notes them.

        A natural stop (EOS) with blocks pending writes their `eos_end` marker; a stop
        at the length cap (or an abort) drops them silently, as the recorder does.
        """
        for rid, natural in zip(rids, natural_stop, strict=True):
            s = self._index.get(rid)
            if s is None:
                continue
            mine = self._blocks.req == s
            if natural and mine.any():
                marker = {"rid": rid, "eos_end": self._blocks.fct[mine].tolist()}
                self._file.write(json.dumps(marker) + "\n")
                self.lines += 1
            self._forget(np.array([s]))
