"""`/server_info` snapshots into new, ordered steps: de-duplicated, holes counted.

SGLang never clears its step records by itself, so every `/server_info` snapshot
repeats what the previous one held, and the 200,000-record cap drops the oldest ones
silently. Whoever reads snapshots (a `curl` loop's file) must therefore de-duplicate
by `(rank, forward_ct)` and count the holes; `ServerInfoReader` does both, incrementally,
for whole files and for a file that is still growing.

A snapshot is kept as its own JSON text, cut into records (`telemetry.server_info_raw`),
and converted a chunk at a time when its steps are taken: a file is held about once in
memory, never as a Python object per number. Whatever is wrong is counted by reason with
the first message of each (`problems`), so a refused file says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from itertools import groupby
from typing import Any

import msgspec
import numpy as np
from msgspec import Raw

from ..telemetry import StepBatch
from ..telemetry.batch import MAX_STEP_GAP
from ..telemetry.server_info import (
    MAX_DP_RANKS,
    SGLangFormatError,
    WorkloadOf,
    decode_info_record,
)
from ..telemetry.server_info_raw import (
    ENVELOPE_FIELDS,
    Key,
    answer_records,
    check_gamma,
    chunks,
    convert_records,
    rank_records,
    valid_step_number,
)
from .lenient import decode_lenient, flaw


class RecordDedup:
    """Which `(rank, forward_ct)` were seen, and how many are missing in between.

    A set, not a high-water mark, so files may be given in any order (an older
    dump after a newer one still fills holes instead of being dropped). Only valid
    step counters (0..2**53) are offered; a hole wider than MAX_STEP_GAP is a jump
    of the counter (`jumps`), never counted as missing steps.
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

    def _holes(self, seen: set[int]) -> np.ndarray:
        steps = np.fromiter(seen, dtype=np.int64, count=len(seen))
        steps.sort()
        return np.diff(steps) - 1

    def dropped(self) -> dict[int, int]:
        """Per rank: forward_ct values missing between the lowest and highest seen."""
        out = {}
        for rank, seen in self.seen.items():
            holes = self._holes(seen)
            out[rank] = int(holes[holes <= MAX_STEP_GAP].sum())
        return out

    def jumps(self) -> int:
        """Holes too wide to be steps lost, over all ranks."""
        return sum(int((self._holes(s) > MAX_STEP_GAP).sum()) for s in self.seen.values())

    def ranges(self) -> dict[int, tuple[int, int]]:
        return {rank: (min(s), max(s)) for rank, s in self.seen.items() if s}


class ServerInfoReader:
    """Turns `/server_info` snapshots into new, ordered StepBatches, skipping bad records.

    One bad record (a wrong type, NaN, invalid UTF-8), one bad rank envelope (a gamma
    nothing runs) or ranks beyond MAX_DP_RANKS cost themselves only; each is counted in
    `bad` by reason, the first message of each reason kept in `problems`. Batches come
    out of `take_batches` ordered by forward_ct (ranks interleaved), which is the order
    the estimator needs per rank.
    """

    def __init__(self, workload_of: WorkloadOf) -> None:
        self.workload_of = workload_of
        self.dedup = RecordDedup()
        self.bad: Counter[str] = Counter()
        self.problems: dict[str, str] = {}
        self.snapshots = 0
        self.ranks_with_records: set[int] = set()
        self.gamma: int | None = None
        self.mode: str | None = None
        self.components: set[str] = set()
        #: (forward_ct, rank, envelope number, the record's JSON text)
        self._pending: list[tuple[int, int, int, Raw | bytes]] = []
        self._envelopes: list[dict] = []

    def _refuse(self, reason: str, message: str, count: int = 1) -> None:
        self.bad[reason] += count
        self.problems.setdefault(reason, message)

    def add_document(self, document: bytes) -> bool:
        """Fold in one document of a file (its text); False, counted by reason, for one that
        is not a `/server_info` answer at all."""
        try:
            self.add_snapshot(document)
        except SGLangFormatError as exc:
            self._refuse("not_a_snapshot" if exc.reason == "bad_json" else exc.reason, str(exc))
            return False
        return True

    def add_snapshot(self, payload: Any) -> int:
        """Fold in one `/server_info` answer (its JSON text, or decoded); returns how many
        steps were new.

        Raises `SGLangFormatError` when the payload is not a server_info at all,
        so a caller can refuse a wrong file before writing anything.
        """
        if isinstance(payload, (bytes, bytearray, memoryview)):
            try:
                ranks = [(r, None) for r in answer_records(payload)]
            except msgspec.DecodeError:  # NaN, invalid UTF-8, or not JSON at all
                return self.add_snapshot(decode_lenient(payload))
        else:
            states = payload.get("internal_states") if isinstance(payload, dict) else None
            if not isinstance(states, list):
                raise SGLangFormatError("server_info has no internal_states list", "bad_json")
            ranks = [
                (None, s.get("dspark_info_record") if isinstance(s, dict) else None) for s in states
            ]
        self.snapshots += 1
        if len(ranks) > MAX_DP_RANKS:
            self._refuse(
                "too_many_ranks",
                f"a snapshot lists {len(ranks)} ranks, more than {MAX_DP_RANKS}: "
                f"ranks {MAX_DP_RANKS} and up are left out",
                len(ranks) - MAX_DP_RANKS,
            )
            del ranks[MAX_DP_RANKS:]
        new = 0
        for rank, (text, decoded) in enumerate(ranks):
            try:
                if text is not None:
                    new += self._add_rank(rank, text)
                elif decoded is not None:
                    new += self._add_decoded_rank(rank, decoded)
            except SGLangFormatError as exc:
                self._refuse(exc.reason, f"rank {rank}: {exc}")
        return new

    def _add_decoded_rank(self, rank: int, env: Any) -> int:
        """A rank given decoded (or read leniently): its envelope checked, each flawed record
        refused by name, the rest kept as they are."""
        if not isinstance(env, dict) or not isinstance(env.get("records"), list):
            raise SGLangFormatError("not a dspark_info_record (no records list)", "bad_envelope")
        fields = {k: env[k] for k in ENVELOPE_FIELDS if k in env}
        bad = flaw(fields)
        if bad is not None:
            raise SGLangFormatError(f"its envelope holds {bad[1]}", "bad_envelope")
        try:
            info = decode_info_record({**fields, "records": []})
        except SGLangFormatError as exc:
            raise SGLangFormatError(str(exc), "bad_envelope") from None
        check_gamma(info.gamma)
        records = []
        for rec in env["records"]:
            bad = flaw(rec)
            if bad is None:
                records.append(rec)
            else:
                fct = rec.get("forward_ct") if isinstance(rec, dict) else None
                self._refuse(bad[0], f"rank {rank}, forward_ct {fct}: {bad[1]}")
        keys = [Key(r.get("forward_ct") if isinstance(r, dict) else None) for r in records]
        fcts = np.fromiter(map(valid_step_number, keys), dtype=np.int64, count=len(keys))
        return self._register(rank, fields, records, fcts)

    def _add_rank(self, rank: int, record: Raw | None) -> int:
        if record is None:
            return 0
        return self._register(rank, *rank_records(record))

    def _register(self, rank: int, fields: dict, records: list, fcts: np.ndarray) -> int:
        """A rank's records pending conversion, those seen before left out."""
        self.ranks_with_records.add(rank)
        if self.gamma is None:
            self.gamma, self.mode = fields["gamma"], fields["mode"]
        self.components.update(str(c) for c in fields["components"])
        envelope = len(self._envelopes)
        self._envelopes.append(fields)
        new = 0
        for fct, raw in zip(fcts.tolist(), records, strict=True):
            if fct < 0:  # refused by its conversion, with the reason
                self._pending.append((-1, rank, envelope, raw))
            elif self.dedup.offer(rank, fct):
                self._pending.append((fct, rank, envelope, raw))
                new += 1
        return new

    def take_batches(self) -> Iterator[StepBatch]:
        """The new steps since the last call, converted a chunk at a time; records that fail
        are counted."""
        pending, self._pending = self._pending, []
        pending.sort(key=lambda p: (p[0], p[1]))
        texts = [p[3] for p in pending]
        for indexes in chunks(texts, np.arange(len(pending))):
            chunk = pending[indexes[0] : indexes[-1] + 1]
            converted: list[tuple[int, int, StepBatch]] = []
            key = lambda p: (p[1], p[2])  # noqa: E731 (rank, envelope)
            for (rank, envelope), group in groupby(sorted(chunk, key=key), key=key):
                group = list(group)
                batches = convert_records(
                    [p[3] for p in group],
                    self._envelopes[envelope],
                    rank,
                    self._refuse_record,
                    self.workload_of,
                )
                converted += [(b.forward_ct, b.rank, b) for b in batches]
                # a refused record's step is a hole in the rank's sequence, like one never read
                refused = {p[0] for p in group} - {b.forward_ct for b in batches} - {-1}
                if refused:
                    self.dedup.seen[rank] -= refused
            converted.sort(key=lambda c: (c[0], c[1]))
            yield from (b for *_, b in converted)

    def _refuse_record(self, exc: SGLangFormatError) -> None:
        self._refuse(exc.reason, str(exc))

    @property
    def dropped(self) -> dict[int, int]:
        return self.dedup.dropped()


def has_timing(batch: StepBatch) -> bool:
    """Whether a step carries a measured time (SGLang's timing components)."""
    return any(
        getattr(batch, name, None) is not None and not np.isnan(getattr(batch, name))
        for name in ("step_cpu_ms", "step_gpu_ms")
    )
