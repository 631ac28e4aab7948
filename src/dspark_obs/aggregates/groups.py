"""Label groups: which (workload, mode, rank) a request-step counts under.

Workload names come from traffic, so their number is not ours to choose: the
first `workload_cap` names seen keep their own group, every later one is
counted under `other`. Ranks multiply them: a node of 64 ranks each serving the
16 workloads would publish 64 × 17 groups of about 165 series each, so at most
`GROUP_CAP` (workload, mode, rank) groups of named workloads are kept in all, and
past that a rank's next workload is counted under that rank's `other` too. That
bounds both memory and Prometheus series however many names and ranks a source
invents; the rows counted under `other` are `dspark_workload_overflow_total`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..telemetry import StepBatch

OTHER = "other"


#: Most workload tables (one per distinct `workload_names` tuple, mode and rank) kept.
_LUT_LIMIT = 4096
#: Most groups of named workloads, over all ranks and modes: 8 ranks × 16 workloads × 2 modes,
#: about 42,000 series at the series budget's 165 a group (docs/metrics.md).
GROUP_CAP = 256


class GroupIndex:
    def __init__(self, workload_cap: int = 16, group_cap: int = GROUP_CAP) -> None:
        if workload_cap < 1 or group_cap < 1:
            raise ValueError("workload cap and group cap must be >= 1")
        self.workload_cap = workload_cap
        self.group_cap = group_cap
        self.named_groups = 0
        self.workloads: dict[str, int] = {}
        self.groups: list[tuple[str, str, int]] = []  # group id -> (workload, mode, rank)
        self._ids: dict[tuple[str, str, int], int] = {}
        self._lut: dict[tuple, np.ndarray] = {}
        self.is_other = np.zeros(0, dtype=bool)
        self.overflow_rows = 0
        self.overflow_names: set[str] = set()

    def _workload(self, name: str) -> str:
        if name in self.workloads or name == OTHER:
            return name
        if len(self.workloads) < self.workload_cap:
            self.workloads[name] = len(self.workloads)
            return name
        if len(self.overflow_names) < 1024:
            self.overflow_names.add(name)
        return OTHER

    def group(self, workload: str, mode: str, rank: int) -> int:
        key = (self._workload(workload), mode, int(rank))
        gid = self._ids.get(key)
        if gid is None and key[0] != OTHER:
            if self.named_groups >= self.group_cap:  # this rank's `other`, counted
                if len(self.overflow_names) < 1024:
                    self.overflow_names.add(key[0])
                return self.group(OTHER, mode, rank)
            self.named_groups += 1
        if gid is None:
            gid = self._ids[key] = len(self.groups)
            self.groups.append(key)
            self.is_other = np.append(self.is_other, key[0] == OTHER)
        return gid

    def rows(self, batches: Sequence[StepBatch]) -> np.ndarray:
        """Group id of every request row of `batches` (at least one), in order: one lookup
        for all of them, into the tables of their workloads, laid end to end."""
        tables, codes = zip(*map(self._table, batches), strict=True)
        if len(tables) == 1:
            gids = tables[0][codes[0]]
        else:
            starts = np.cumsum([0, *map(len, tables[:-1])])
            shift = np.repeat(starts, list(map(len, codes)))
            gids = np.concatenate(tables)[np.concatenate(codes) + shift]
        if self.overflow_names:
            self.overflow_rows += int(np.count_nonzero(self.is_other[gids]))
        return gids

    def _table(self, batch: StepBatch) -> tuple[np.ndarray, np.ndarray]:
        """A batch's rows as (group id of each of its workloads, each row's workload)."""
        if batch.workload_codes is not None and batch.workload_names is not None:
            key = (batch.mode, batch.rank, batch.workload_names)
            table = self._lut.get(key)
            if table is None:
                # SGLang's decoder names each step's own workloads, so the keys vary with
                # what the rids say: bounded, or a stream of new names would grow it
                if len(self._lut) >= _LUT_LIMIT:
                    self._lut.clear()
                table = np.array(
                    [self.group(w, batch.mode, batch.rank) for w in batch.workload_names],
                    dtype=np.int64,
                )
                self._lut[key] = table
            return table, batch.workload_codes
        names, inverse = np.unique(batch.workload.astype(str), return_inverse=True)
        table = np.array([self.group(w, batch.mode, batch.rank) for w in names], dtype=np.int64)
        return table, inverse.reshape(-1)
