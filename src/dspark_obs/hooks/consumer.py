"""One hook ring's packed steps, into the pipeline.

It runs in the node's consumer process (`node_consumer`), so that aggregating,
walking tails and serving `/metrics` never take the serving process's GIL; in tests
it runs in-process through the hook's `drain`. It can lag as it likes: every number
it needs was computed on the device while the step's logits existed, including the
tail walk's gathers, which `gather` hands the estimator by (row, offset, token).
The ring says which rank, engine and verify mode its steps are.
"""

from __future__ import annotations

import logging

import numpy as np

from ..pipeline import Pipeline
from ..telemetry import StepBatch
from . import shared_ring as sr
from .step_layout import HAS_BUDGET, HAS_CONFIDENCE, HAS_RAW, HAS_TARGET, StepLayout

log = logging.getLogger(__name__)


class HookConsumer:
    def __init__(self, ring: sr.SharedRing, pipeline: Pipeline) -> None:
        self.ring, self.pipeline = ring, pipeline
        self.mode, self.rank = ring.mode, ring.rank
        self.source = sr.source_name(ring.engine)
        self.layout = StepLayout(ring.gamma, ring.entries)
        self.seq = int(ring.header[sr.H_CONSUMED])
        self.evicted = 0
        #: slots skipped as broken (counted as `ring_slot_corrupt` in the pipeline's stats)
        self.corrupt = 0

    def drain(self, limit: int | None = None) -> int:
        """Feed every step that is ready (at most `limit`); how many were fed."""
        n = 0
        while (limit is None or n < limit) and self.ring.ready(self.seq + 1):
            seq = self.seq + 1
            try:
                batch, gather = self._read(seq)
            except (ValueError, IndexError, TypeError) as exc:
                # another process writes the ring: a slot it left broken is skipped and
                # counted, and the consumer goes on with the next one
                batch = None
                self.corrupt += 1
                self.pipeline.stats.error(
                    self.source,
                    "ring_slot_corrupt",
                    f"rank {self.rank}: the ring slot of step {seq} is broken ({exc}); skipped",
                )
            self.ring.release(seq)
            self.seq = seq
            if batch is not None:
                self.pipeline.ingest(batch, self.source, gather)
            n += 1
        return n

    def _read(self, seq: int):
        """Step `seq`'s slot as a batch, copied out of the ring; ValueError where its
        scalars do not describe a step this ring can hold."""
        ring = self.ring
        slot = seq % ring.slots
        meta = ring.metas[slot].copy()
        bs, rid_len = int(meta[sr.M_BS]), int(meta[sr.M_RID_LEN])
        if not 0 <= bs <= ring.max_bs or not 0 <= rid_len <= ring.rid_bytes:
            raise ValueError(f"batch size {bs}, {rid_len} request-id bytes")
        packed = ring.packed[slot][:bs].copy()
        rids = bytes(ring.rids[slot][:rid_len]).decode(errors="surrogateescape")
        if bs and rids.count("\n") != bs - 1:
            raise ValueError(f"{rids.count(chr(10)) + 1} request ids for a batch of {bs}")
        return self.to_batch(meta, rids, packed)

    def pending(self) -> bool:
        """Whether a step is ready that has not been fed."""
        return self.ring.ready(self.seq + 1)

    def to_batch(self, meta: np.ndarray, rids: str, packed: np.ndarray):
        lay, g = self.layout, self.layout.gamma
        c = lay.columns
        bs = len(packed)
        flags = int(meta[sr.M_FLAGS])

        def ints(name: str) -> np.ndarray:
            return packed[:, lay.col(name)].astype(np.int64)

        greedy = ints("greedy").astype(np.int8)
        evicted = int(np.count_nonzero(packed[:, lay.col("evicted")] == 1))
        if evicted:
            if not self.evicted:
                log.warning(
                    "hook: a request slot held more open tails than the device table keeps; "
                    "the oldest one's gather is lost (further ones are only counted)"
                )
            self.evicted += evicted
        conf = packed[:, c["confidence"]] if flags & HAS_CONFIDENCE else None
        has_target = bool(flags & HAS_TARGET)
        verify_tokens = int(meta[sr.M_VERIFY_TOKENS])
        batch = StepBatch(
            forward_ct=int(meta[sr.M_FORWARD_CT]),
            gamma=g,
            mode=self.mode,
            rank=self.rank,
            bs=bs,
            budget=int(meta[sr.M_BUDGET]) if flags & HAS_BUDGET else None,
            num_running_reqs=bs,
            num_verify_tokens=verify_tokens,
            verify_tokens_local=verify_tokens,
            verify_tokens_graph_key=verify_tokens,
            rid=np.array(rids.split("\n") if bs else [], dtype=object),
            workload=np.full(bs, "other", dtype=object),
            req_pool_index=ints("pool"),
            prefix_len=ints("prefix"),
            verify_len=ints("window") + 1,
            correct_drafts=ints("accepted"),
            acc_len=ints("committed"),
            cap_trim=ints("cap_trim"),
            bonus_token=ints("bonus"),
            greedy=greedy,
            temperature=np.where(greedy == 1, 0.0, packed[:, lay.col("temperature")]),
            shadow_ceiling=np.full(bs, -1, dtype=np.int64),
            bonus_logprob=packed[:, lay.col("bonus_logprob")].copy(),
            draft_tokens=packed[:, c["draft"]].astype(np.int64),
            confidence=None if conf is None else conf.copy(),
            survival=None if conf is None else np.cumprod(conf, axis=1),
            confidence_logits=packed[:, c["confidence_raw"]].copy() if flags & HAS_RAW else None,
            draft_logprobs=packed[:, c["draft_logprob"]].copy() if has_target else None,
            target_logprobs=packed[:, c["target_logprob"]].copy() if has_target else None,
        )
        offsets = packed[:, c["gather_offset"]]
        tokens = packed[:, c["gather_token"]]
        values = packed[:, c["gather_logprob"]]

        def gather(rows: np.ndarray, positions: np.ndarray, toks: np.ndarray) -> np.ndarray:
            """The device's gathers for these (row, offset, token); NaN where it made none."""
            hit = (offsets[rows] == positions[:, None]) & (tokens[rows] == toks[:, None])
            found = hit.any(1)
            picked = values[rows, hit.argmax(1)]
            return np.where(found, picked, np.nan)

        return batch, gather
