"""`/server_info` snapshots into new, ordered steps: de-duplicated, holes counted.

SGLang never clears its step records by itself, so every `/server_info` snapshot
repeats what the previous one held, and the 200,000-record cap drops the oldest ones
silently. Whoever reads snapshots (a `curl` loop's file) must therefore de-duplicate
by `(rank, forward_ct)` and count the holes; `ServerInfoReader` does both, incrementally,
for whole files and for a file that is still growing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..telemetry import StepBatch
from ..telemetry.batch import MAX_GAMMA, MODES
from ..telemetry.server_info import (
    DecodeStepRecord,
    SGLangFormatError,
    WorkloadOf,
    decode_step_record,
    record_to_batch,
    server_info_ranks,
)


class RecordDedup:
    """Which `(rank, forward_ct)` were seen, and how many are missing in between.

    A set, not a high-water mark, so files may be given in any order (an older
    dump after a newer one still fills holes instead of being dropped).
    """

    def __init__(self) -> None:
        self.seen: dict[int, set[int]] = {}
        self.duplicates = 0

    def offer(self, rank: int, forward_ct: int) -> bool:
        """True the first time a step is offered; later offers count as duplicates."""
        seen = self.seen.setdefault(rank, set())
        if forward_ct in seen:
            self.duplicates += 1
            return False
        seen.add(forward_ct)
        return True

    def dropped(self) -> dict[int, int]:
        """Per rank: forward_ct values missing between the lowest and highest seen."""
        return {rank: (max(s) - min(s) + 1 - len(s)) if s else 0 for rank, s in self.seen.items()}

    def ranges(self) -> dict[int, tuple[int, int]]:
        return {rank: (min(s), max(s)) for rank, s in self.seen.items() if s}


class ServerInfoReader:
    """Turns `/server_info` snapshots into new, ordered StepBatches, skipping bad records.

    Records are decoded one by one (not the rank's envelope as a whole) so one
    corrupted record costs that record only; each skip is counted in `bad` by
    reason. Batches come out of `take_batches` ordered by forward_ct (ranks
    interleaved), which is the order the estimator needs per rank.
    """

    def __init__(self, workload_of: WorkloadOf) -> None:
        self.workload_of = workload_of
        self.dedup = RecordDedup()
        self.bad: Counter[str] = Counter()
        self.snapshots = 0
        self.ranks_with_records: set[int] = set()
        self.gamma: int | None = None
        self.mode: str | None = None
        self.components: set[str] = set()
        self._pending: list[tuple[int, int, DecodeStepRecord, int, str]] = []

    def add_snapshot(self, payload: Any) -> int:
        """Fold in one decoded `/server_info` answer; returns how many steps were new.

        Raises `SGLangFormatError` when the payload is not a server_info at all,
        so a caller can refuse a wrong file before writing anything.
        """
        ranks = server_info_ranks(payload)
        self.snapshots += 1
        new = 0
        for rank, env in enumerate(ranks):
            if env is None:
                continue
            new += self._add_rank(rank, env)
        return new

    def _add_rank(self, rank: int, env: Any) -> int:
        records = env.get("records") if isinstance(env, dict) else None
        gamma, mode = (env.get("gamma"), env.get("mode")) if isinstance(env, dict) else (None, None)
        if not isinstance(records, list) or not isinstance(gamma, int) or isinstance(gamma, bool):
            self.bad["bad_envelope"] += 1
            return 0
        if not 1 <= gamma <= MAX_GAMMA:  # the run's aggregates are sized by it
            self.bad["bad_envelope"] += 1
            return 0
        if mode not in MODES:
            self.bad["bad_envelope"] += 1
            return 0
        self.ranks_with_records.add(rank)
        if self.gamma is None:
            self.gamma, self.mode = gamma, mode
        comps = env.get("components")
        if isinstance(comps, list):
            self.components.update(str(c) for c in comps)
        new = 0
        for raw in records:
            try:
                rec = decode_step_record(raw)
            except SGLangFormatError as exc:
                self.bad[exc.reason] += 1
                continue
            if not self.dedup.offer(rank, rec.forward_ct):
                continue
            self._pending.append((rec.forward_ct, rank, rec, gamma, mode))
            new += 1
        return new

    def take_batches(self) -> Iterator[StepBatch]:
        """The new steps since the last call, converted; records that fail are counted."""
        pending, self._pending = self._pending, []
        pending.sort(key=lambda p: (p[0], p[1]))
        for _, rank, rec, gamma, mode in pending:
            try:
                yield record_to_batch(
                    rec, gamma=gamma, mode=mode, rank=rank, workload_of=self.workload_of
                )
            except SGLangFormatError as exc:
                self.bad[exc.reason] += 1

    @property
    def dropped(self) -> dict[int, int]:
        return self.dedup.dropped()


def has_timing(batch: StepBatch) -> bool:
    """Whether a step carries a measured time (SGLang's timing components)."""
    return any(
        getattr(batch, name, None) is not None and not np.isnan(getattr(batch, name))
        for name in ("step_cpu_ms", "step_gpu_ms")
    )
