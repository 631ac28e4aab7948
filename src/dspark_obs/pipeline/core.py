"""The pipeline: every source's StepBatches pass one gate into the aggregates and the store.

A long-running service must never die on bad input, and must not silently drop
it either: a batch that breaks the telemetry model is rejected, counted per
source and reason (`dspark_ingest_errors_total`), logged once per reason, and
processing continues. Accepted batches reach the aggregates and, when a run
store is open, the store.
"""

from __future__ import annotations

import threading

import numpy as np

from .. import names
from ..aggregates import Aggregates
from ..domain.cost_table import AdditiveCostTable
from ..estimator.ceiling_estimator import CeilingEstimator
from ..estimator.tails import Gather
from ..sources.stats import IngestStats
from ..store import RunWriter
from ..telemetry import StepBatch
from ..telemetry.batch import InvalidBatch

#: The `dspark_ingest_errors_total` reason counting accepted request-steps whose rid or
#: workload name was changed to be kept (`names.clean`).
NAME_CLEANED = "name_cleaned"


def clean_names(batch: StepBatch) -> tuple[int, str]:
    """Clean `batch`'s rids and workload names in place (`names.clean`): how many rows
    changed, and a line saying how the first of them did.

    Every name reaches labels, tables, reports and the store from here, so this is where
    the rule is applied, once; a row with a bad name is kept, under the cleaned name.
    """
    rid, workload = batch.rid, batch.workload
    rids, bad_rids = names.clean_list(rid.tolist())
    if batch.workload_names is not None and batch.workload_codes is not None:
        table, bad_workloads = names.clean_list(list(batch.workload_names))
        if bad_workloads:
            batch.workload_names = tuple(table)
            batch.workload = _objects(table)[batch.workload_codes]
    else:
        workloads, bad_workloads = names.clean_list(workload.tolist())
        if bad_workloads:
            batch.workload = _objects(workloads)
    if not (bad_rids or bad_workloads):
        return 0, ""
    if bad_rids:
        batch.rid = _objects(rids)
    changed = (rid != batch.rid) | (workload != batch.workload)
    row = int(np.argmax(changed))
    what = "rid" if rid[row] != batch.rid[row] else "workload"
    before, after = (rid, batch.rid) if what == "rid" else (workload, batch.workload)
    return int(np.count_nonzero(changed)), (
        f"a {what} with unprintable characters or over {names.MAX_LEN} characters "
        f"({_shown(before[row])}) is kept as {_shown(after[row])}"
    )


def _objects(values: list) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _shown(name: object) -> str:
    """A name in a log line: escaped, and its first 60 characters only."""
    text = str(name)
    more = f" ({len(text):,} characters)" if len(text) > 60 else ""
    return repr(names.printable(text[:60])) + more


class StoreFailed(RuntimeError):
    """The run store could not take a step (a full disk, a vanished directory).

    Not a bad step: every later one would fail alike, and a service that went on would
    publish metrics its run no longer records. Whoever feeds the pipeline stops on it.
    """


class Pipeline:
    def __init__(
        self,
        aggregates: Aggregates,
        writer: RunWriter | None = None,
        stats: IngestStats | None = None,
        estimator: CeilingEstimator | None = None,
    ) -> None:
        self.aggregates = aggregates
        self.writer = writer
        self.stats = stats or IngestStats()
        self.estimator = estimator
        self._steps = 0
        self._lock = threading.Lock()  # several sources may feed one pipeline

    def ingest(
        self, batch: StepBatch, source: str = "runtime", gather: Gather | None = None
    ) -> bool:
        """Validate and fold in one step; False (counted, logged once) when rejected.

        `gather` reads target log-probabilities from the step just verified, for
        the estimator's sampled walks, where the source can provide them.
        """
        with self._lock:
            return self._ingest(batch, source, gather)

    def _ingest(self, batch: StepBatch, source: str, gather: Gather | None) -> bool:
        try:
            if batch.gamma != self.aggregates.gamma:
                raise InvalidBatch(
                    "gamma_mismatch",
                    f"gamma {batch.gamma}, this pipeline runs gamma {self.aggregates.gamma}",
                )
            batch.validate()
        except InvalidBatch as exc:
            self.stats.error(source, exc.reason, str(exc))
            return False
        changed, example = clean_names(batch)
        if changed:
            self.stats.error(source, NAME_CLEANED, example, changed)
        self.aggregates.update(batch)
        if self.estimator is not None:
            self.estimator.update(batch, gather)
        if self.writer is not None:
            try:
                self.writer.append(batch)
                self._steps += 1
                if self.estimator is not None and self._steps % 256 == 0:
                    self._store_ceilings()
            except OSError as exc:
                raise StoreFailed(f"the run store failed: {exc}") from exc
        self.stats.record(source)
        return True

    def _store_ceilings(self) -> None:
        rows = self.estimator.take_rows()
        if rows is not None and self.writer is not None:
            self.writer.write_rows("ceilings", rows)

    def close(self, extra_manifest: dict | None = None) -> None:
        with self._lock:
            self._close(extra_manifest)

    def _close(self, extra_manifest: dict | None) -> None:
        self.aggregates.flush()
        if self.estimator is not None:
            self.estimator.close()
            self._store_ceilings()
        if self.writer is not None:
            self.writer.close(extra_manifest)


def build_pipeline(
    gamma: int,
    *,
    writer: RunWriter | None = None,
    stats: IngestStats | None = None,
    workload_cap: int = 16,
    window_steps: int = 1024,
    assume_greedy: bool | None = None,
    cost_table: AdditiveCostTable | None = None,
    capture_tiers: tuple[int, ...] | None = None,
    publish: bool = True,
) -> Pipeline:
    """The one way a pipeline is put together: live aggregates and the ceiling estimator over
    the same label groups and window, and the run store when one is open.

    `assume_greedy` says how requests sample where the source does not (SGLang's dumps):
    None leaves their trimmed tails to the population model alone. `cost_table` and
    `capture_tiers` are the server's, where known (the reference runtime's): the cost of
    trimming prices static's steps with them, and otherwise with the aggregates' online
    refit of each (mode, rank). `publish=False` (a command that only writes a run, such as
    `ingest`) leaves the request rows out of the aggregates, which nothing would read:
    memory then follows the input, not the number of label groups in it.
    """
    aggregates = Aggregates(
        gamma, workload_cap=workload_cap, window_steps=window_steps, requests=publish
    )

    def step_cost(mode: str, rank: int):
        return cost_table if cost_table is not None else aggregates.cost_table(mode, rank)

    return Pipeline(
        aggregates,
        writer,
        stats,
        CeilingEstimator(
            gamma,
            workload_cap=workload_cap,
            window_steps=window_steps,
            assume_greedy=assume_greedy,
            step_cost=step_cost,
            capture_tiers=capture_tiers,
        ),
    )
