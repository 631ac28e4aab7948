"""The pipeline: every source's StepBatches pass one gate into the aggregates and the store.

A long-running service must never die on bad input, and must not silently drop
it either: a batch that breaks the telemetry model is rejected, counted per
source and reason (`dspark_ingest_errors_total`), logged once per reason, and
processing continues. Accepted batches reach the aggregates and, when a run
store is open, the store.
"""

from __future__ import annotations

import threading

from ..aggregates import Aggregates
from ..estimator.online import CeilingEstimator
from ..estimator.tails import Gather
from ..runtime.cost_table import AdditiveCostTable
from ..sources.stats import IngestStats
from ..store import RunWriter
from ..telemetry import StepBatch
from ..telemetry.batch import InvalidBatch


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
) -> Pipeline:
    """The one way a pipeline is put together: live aggregates and the ceiling estimator over
    the same label groups and window, and the run store when one is open.

    `assume_greedy` says how requests sample where the source does not (SGLang's dumps):
    None leaves their trimmed tails to the population model alone. `cost_table` and
    `capture_tiers` are the server's, where known (the reference runtime's): the cost of
    trimming prices static's steps with them, and otherwise with the aggregates' online
    refit of each (mode, rank).
    """
    aggregates = Aggregates(gamma, workload_cap=workload_cap, window_steps=window_steps)

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
