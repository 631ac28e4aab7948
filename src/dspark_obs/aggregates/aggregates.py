"""`Aggregates`: everything the exporter publishes, updated from StepBatches.

Batches are queued and folded in together once enough rows are waiting (or
when someone reads), so numpy's per-call overhead is paid per flush, not per
step: the per-step cost is then the per-element work alone. Reading takes a
consistent snapshot under a lock, so a scrape never sees half a flush and does
no more than reduce fixed-size histograms.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from ..domain.step_cost import DEFAULT_BS_PROBES, DEFAULT_M_PROBES, Refit
from ..telemetry import StepBatch
from .confidence import ConfidenceAggregate
from .cost_model import CostModelAggregate
from .exemplars import RecentObservations
from .groups import GroupIndex
from .published import (
    ConfidenceSeries,
    CostSeries,
    StepSeries,
    TokenSeries,
    WorkloadSeries,
    context_labels,
    request_labels,
    step_labels,
)
from .rows import RequestRows
from .steps import StepAggregate
from .tokens import TokenAggregate


@dataclass
class Snapshot:
    """Plain arrays for one scrape; `total` since start, `window` over the last N steps.

    The tables are the aggregates' own layout; what is published from them is
    `sections()`, in the series model, which publishers read instead.
    """

    gamma: int
    window_steps: int
    groups: list[tuple[str, str, int]]  # request groups: (workload, mode, rank)
    step_groups: list[tuple[str, int]]  # step groups: (mode, rank)
    tokens: dict[str, np.ndarray]
    steps: dict[str, np.ndarray]
    confidence: dict[str, dict[str, np.ndarray]]
    reliability: dict[str, np.ndarray]
    cost: dict[str, dict[str, np.ndarray]]
    refits: list[Refit | None]
    #: `[step group, CONTEXT_BUCKETS, CONTEXT_COLUMNS]` sums since start
    cost_by_context: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0)))
    ingest: dict[str, int] = field(default_factory=dict)
    overflow_rows: int = 0
    #: `exemplars.RecentObservations.copy()`: the token histograms' recent observations
    exemplars: dict = field(default_factory=dict)

    def sections(self) -> dict[str, object | None]:
        """What this snapshot publishes, by section (`aggregates.published`): the request
        sections are None until a request group exists, the step sections until a step
        group does."""
        out: dict[str, object | None] = dict.fromkeys(("tokens", "confidence", "steps", "cost"))
        if self.groups:
            req = request_labels(tuple(self.groups), self.gamma)
            out["tokens"] = TokenSeries(
                req, self.gamma, self.window_steps, self.tokens["total"], self.tokens["window"],
                self.exemplars,
            )  # fmt: skip
            out["confidence"] = ConfidenceSeries(
                req,
                self.window_steps,
                self.confidence["total"],
                self.confidence["window"],
                self.reliability,
            )
        if self.step_groups:
            step = step_labels(tuple(self.step_groups))
            out["steps"] = StepSeries(step, self.window_steps, self.steps["total"])
            out["cost"] = CostSeries(
                step,
                self.window_steps,
                self.cost["total"],
                self.cost["window"],
                self.refits,
                context_labels(tuple(self.step_groups)),
                self.cost_by_context,
            )
        out["workloads"] = WorkloadSeries(self.overflow_rows)
        return out


def _mean_context(batches: list[StepBatch]) -> np.ndarray:
    """Per step: mean context tokens per request (`prefix_len`), NaN for a step without rows."""
    return np.array(
        [b.prefix_len.mean() if b.num_reqs else np.nan for b in batches], dtype=np.float64
    )


class Aggregates:
    def __init__(
        self,
        gamma: int,
        *,
        workload_cap: int = 16,
        window_steps: int = 1024,
        segments: int = 8,
        flush_rows: int = 4096,
        cost_probes: tuple | None = None,
        compiled: bool | None = None,
        requests: bool = True,
    ) -> None:
        """`compiled` picks the request-row fold: C where it was built (None, the default)
        or numpy (False); True insists on C. Both add the same counts.

        `requests=False` folds in the steps alone (load, the cost model the estimator
        prices trimming with), never the request rows: for a command that writes a run and
        publishes nothing, since the rows' histograms cost about 1 MB a label group, and a
        256-rank file has hundreds of groups whatever its size."""
        self.gamma = gamma
        self.requests = requests
        self.flush_rows = flush_rows
        self.index = GroupIndex(workload_cap)
        self.step_groups: dict[tuple[str, int], int] = {}
        self.tokens = TokenAggregate(gamma, window_steps, segments, compiled)
        self.confidence = ConfidenceAggregate(gamma, window_steps, segments, compiled)
        self.steps = StepAggregate(window_steps, segments)
        bs_probes, m_probes = cost_probes or (DEFAULT_BS_PROBES, DEFAULT_M_PROBES)
        self.cost = CostModelAggregate(window_steps, segments, bs_probes, m_probes)
        self.exemplars = RecentObservations(gamma)
        self.window_steps = self.tokens.sums.window_steps
        self._pending: list[StepBatch] = []
        self._pending_rows = 0
        self._rows_done = 0  # leading pending steps whose request rows are already folded in
        self._lock = threading.Lock()

    def update(self, batch: StepBatch) -> None:
        """Queue one validated step; fold the queue in when it is large enough."""
        if batch.gamma != self.gamma:
            raise ValueError(f"gamma {batch.gamma} != {self.gamma}")
        with self._lock:
            self._pending.append(batch)
            self._pending_rows += batch.num_reqs
            # Request rows fold in whenever enough are queued; step-level sums (a few numbers
            # per step) and the window's clock only when the ring's current block is full, so
            # their per-call overhead is paid once per block. A block's steps never spill into
            # the next block, which keeps the window exact.
            if len(self._pending) >= self.tokens.sums.room:
                self._fold()
            elif self._pending_rows >= self.flush_rows:
                self._fold_requests(self._pending[self._rows_done :])
                self._rows_done = len(self._pending)
                self._pending_rows = 0

    def flush(self) -> None:
        with self._lock:
            self._fold()

    def cost_table(self, mode: str, rank: int):
        """The online refit of the (mode, rank) step group as a cost table, None before its
        first (the live cost of trimming prices static's steps with it)."""
        gid = self.step_groups.get((mode, int(rank)))
        return None if gid is None else self.cost.table(gid)

    def _step_group(self, mode: str, rank: int) -> int:
        key = (mode, int(rank))
        gid = self.step_groups.get(key)
        if gid is None:
            gid = self.step_groups[key] = len(self.step_groups)
        return gid

    def _fold(self) -> None:
        batches, done = self._pending, self._rows_done
        self._pending, self._pending_rows, self._rows_done = [], 0, 0
        if not batches:
            return
        self._fold_requests(batches[done:])
        # one pass over the steps for their scalars; counts stay int64 up to the cost cells
        # (validated int64 values near 2**63 round up to 2**63 in float64, which does not
        # cast back), and None becomes NaN in the float64 ones
        ints = np.array(
            [
                (
                    self._step_group(b.mode, b.rank),
                    b.bs,
                    b.num_verify_tokens,
                    b.verify_tokens_graph_key,
                )
                for b in batches
            ],
            dtype=np.int64,
        ).reshape(-1, 4)
        floats = np.array(
            [
                (
                    b.budget,
                    b.predicted_step_ms,
                    b.step_gpu_ms if b.step_gpu_ms is not None else b.step_cpu_ms,
                )
                for b in batches
            ],
            dtype=np.float64,
        ).reshape(-1, 3)
        sgroup, bs, verify_count, tier = ints.T
        if (bs < 0).any():
            bs = np.where(bs >= 0, bs, [b.num_reqs for b in batches])
        n_sg = len(self.step_groups)
        self.steps.sums.ensure_groups(n_sg)
        self.cost.ensure_groups(n_sg)
        tokens = np.where(verify_count >= 0, verify_count, bs)
        self.steps.update(
            sgroup,
            {
                "batch_size": bs.astype(np.float64),
                "budget": floats[:, 0],
                "verify_tokens": np.where(verify_count >= 0, verify_count, np.nan),
                "graph_tier": np.where(tier >= 0, tier, np.nan),
            },
        )
        predicted, measured = floats[:, 1] / 1e3, floats[:, 2] / 1e3
        self.cost.update(sgroup, bs, tokens, predicted, measured, _mean_context(batches))
        for sums in (self.tokens.sums, self.steps.sums, self.cost.errors):
            sums.advance(len(batches))
        self.confidence.advance(len(batches))

    def _fold_requests(self, batches: list[StepBatch]) -> None:
        """Request rows of several steps, folded in together."""
        batches = [b for b in batches if b.num_reqs] if self.requests else []
        if not batches:
            return
        group = self.index.rows(batches)
        n_groups = len(self.index.groups)
        self.tokens.sums.ensure_groups(n_groups)
        self.confidence.ensure_groups(n_groups)
        rows = RequestRows(batches, group)
        self.tokens.update(rows)
        self.confidence.update(rows)
        last = batches[-1]
        self.exemplars.observe(last, group[len(group) - last.num_reqs :], n_groups)

    def snapshot(self) -> Snapshot:
        with self._lock:
            self._fold()
            conf = self.confidence
            return Snapshot(
                gamma=self.gamma,
                window_steps=self.window_steps,
                groups=list(self.index.groups),
                step_groups=list(self.step_groups),
                tokens={
                    "total": self.tokens.sums.total,
                    "window": self.tokens.sums.window(),
                },
                steps={"total": self.steps.sums.total, "window": self.steps.sums.window()},
                confidence={
                    # AUROC is published over the window only
                    "total": conf.metrics(None, conf.coarse.total),
                    # the fine histograms are read in place: the largest table, its window kept
                    # up to date as rows arrive rather than summed at every scrape
                    "window": conf.metrics(conf.fine.win, conf.coarse.window()),
                },
                reliability=conf.reliability(conf.coarse.total, conf.fine.total),
                cost={
                    "total": self.cost.error_metrics(self.cost.errors.total),
                    "window": self.cost.error_metrics(self.cost.errors.window()),
                },
                refits=list(self.cost.refits),
                cost_by_context=self.cost.by_context.copy(),
                overflow_rows=self.index.overflow_rows,
                exemplars=self.exemplars.copy(),
            )
