"""The simulated data-parallel ranks: each an engine stepping on its own thread.

A rank steps while it holds requests and keeps its step records for `/server_info`; the
request threads only queue work on a rank and wait for it to finish, so each engine is
stepped by its rank's thread alone.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass, field

from ..runtime.config import RuntimeConfig
from ..runtime.external import ExternalRequest, FinishedRequest
from ..runtime.factory import make_runtime
from ..telemetry.server_info import batch_to_record, batches_to_info_record
from .protocol import RequestError

log = logging.getLogger(__name__)

#: What this front dumps, as `SGLANG_DSPARK_DEBUG_DUMP=core,reqs,step_gpu_time,step_cpu_time`.
COMPONENTS = ("core", "reqs", "step_cpu_time", "step_gpu_time")
MAX_RECORDS = 200_000


@dataclass
class _Waiter:
    done: threading.Event = field(default_factory=threading.Event)
    result: FinishedRequest | None = None
    error: str | None = None


class Rank:
    """One simulated DP rank: an engine, its step thread and its record buffer."""

    def __init__(
        self, index: int, config: RuntimeConfig, speed: float, max_records: int = MAX_RECORDS
    ) -> None:
        self.index = index
        self.engine = make_runtime(config)
        self.speed = speed
        self.records: deque = deque(maxlen=max_records)
        self.steps = 0
        #: requests stopped because their client went away before the answer
        self.aborted = 0
        self.force_budget_frac: float | None = None
        self._engine_lock = threading.Lock()
        self._wake = threading.Condition(self._engine_lock)
        # Separate from the engine lock so that /server_info never waits for a step.
        self._records_lock = threading.Lock()
        self._waiters: dict[str, _Waiter] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"dspark-rank-{index}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        self._thread.join(timeout=5)

    def submit(self, req: ExternalRequest) -> _Waiter:
        waiter = _Waiter()
        with self._wake:
            if req.rid in self._waiters:
                raise RequestError(f"rid {req.rid!r} is already running")
            self._waiters[req.rid] = waiter
            self.engine.pending.append(req)
            self._wake.notify()
        return waiter

    def abort(self, rids: set[str]) -> None:
        """Stop the requests `rids` (their clients went away) and forget their waiters."""
        with self._wake:
            for rid in rids:
                self._waiters.pop(rid, None)
            self.aborted += self.engine.abort_external(rids)

    def running(self) -> int:
        return len(self._waiters)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._wake:
                while not self.engine.has_external_work and not self._stop.is_set():
                    self._wake.wait(0.5)
                if self._stop.is_set():
                    break
                try:
                    step = self.engine.step_external()
                except Exception as exc:  # fail the waiting clients, keep the rank alive
                    log.exception("rank %d: step failed", self.index)
                    self._fail_all(f"engine step failed: {exc!r}")
                    continue
                if step is None:
                    continue
                finished = [(self._waiters.pop(f.rid, None), f) for f in step.finished]
            batch = step.batch
            batch.rank = self.index
            record = batch_to_record(batch)
            # Outside what this front claims to dump (COMPONENTS): left unset, as in SGLang.
            record.draft_gpu_ms = record.target_verify_gpu_ms = None
            with self._records_lock:
                self.records.append(record)
                self.steps += 1
            for waiter, result in finished:
                if waiter is not None:
                    waiter.result = result
                    waiter.done.set()
            if self.speed > 0 and batch.step_gpu_ms is not None:
                self._stop.wait(batch.step_gpu_ms / 1e3 / self.speed)
        self._fail_all("server shutting down")

    def _fail_all(self, message: str) -> None:
        waiters = list(self._waiters.values())
        self._waiters.clear()
        self.engine.pending.clear()
        self.engine.active[:] = False
        for w in waiters:
            w.error = message
            w.done.set()

    def info_record(self) -> dict:
        with self._records_lock:
            records = list(self.records)
            steps = self.steps
        c = self.engine.config
        info = batches_to_info_record([], mode=c.mode, gamma=c.gamma, components=COMPONENTS)
        info["records"] = records
        return {
            "dspark_info_record": info,
            "dspark_steps": steps,
            "num_running_reqs": self.running(),
            "dspark_force_budget_frac": self.force_budget_frac,
        }

    def clear_records(self) -> None:
        with self._records_lock:
            self.records.clear()
