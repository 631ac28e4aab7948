"""A live SGLang DSpark server as a source: poll `GET /server_info`, one stream per DP rank.

Each entry of `internal_states` is one data-parallel rank; its
`dspark_info_record` holds the step records the server kept (at most 200,000,
oldest dropped, never cleared by itself). After each read the poller drains
them with `POST /set_internal_state {"server_args":
{"dspark_clear_info_records": true}}` unless told not to (operators who share
the buffer with other readers), as soon as the answer has arrived: before
decoding or ingesting it, so that the window between the two is the server's
serialisation of the answer plus two round trips. Either way records are
de-duplicated by (rank, forward_ct): without draining, consecutive reads
overlap; with it, steps recorded in that window are lost, and show up as gaps
once a later step of the rank arrives. Not so for the steps of a server run
before the first one the poller takes (an idle server's empty answer, then a
drain that catches the run's first steps): the server's answers number steps
but say nothing of where a run's numbering starts, so those cannot be told
from steps taken before the poller began, and are counted nowhere.

A step counter that goes backwards means the server restarted: with draining on, a
step no newer than the last one taken (the drain left only newer ones); without it,
an answer whose newest step is older than that, or whose step of the last one's
number is not that step (its record's text differs). The rank's new life is stored after
its old one, not over it: its step numbers are shifted past the last step taken
(`forward_ct` is the server's counter plus the rank's offset, logged once a restart
and counted as `server_restart`), so each stored step keeps its own key and a
reader never pools the steps of two lives under one (a restart under `serve --out`
otherwise summed two steps' tokens into one step's load). Gaps are counted as
dropped steps; a jump wider than MAX_STEP_GAP is a counter that cannot be trusted,
counted as such and followed, never as a gap. A component the server does not dump
(no `reqs`: no per-request metrics) is reported once, clearly. Every failure
(connection refused, timeout, HTTP error, truncated JSON, an answer over the
byte limit, a record that breaks the schema) is counted by reason and logged
once per reason; the poller backs off and keeps trying, and `dspark_source_up`
says whether it is getting data.

A rank's records are converted a chunk at a time, each chunk in one pass over
its JSON text (the compiled parser where it is built): at B = 256 a
record-by-record conversion costs milliseconds per step, more than a busy
server's step rate allows, and a whole large answer converted at once took
twenty times its size in memory. A chunk whose records are not all plainly valid
goes record by record instead, so that each bad record is counted by its reason
and the rest are kept (`telemetry.server_info_raw`).

A stop (SIGTERM) ends a poll under way at once (`sglang_http`); an answer already
taken, and cleared on the server, is still converted for `drain_seconds`, and what
is left then is counted as `dropped_at_stop`, so no step taken is lost silently.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import numpy as np
from msgspec import Raw

from ..secret_text import check_secret
from ..telemetry import StepBatch
from ..telemetry.batch import MAX_STEP_GAP, InvalidBatch
from ..telemetry.server_info import SGLangFormatError, check_rank_count
from ..telemetry.server_info_raw import (
    RankRecords,
    answer_records,
    chunks,
    convert_records,
    rank_records,
)
from .sglang_http import (
    DEFAULT_MAX_BYTES,
    Cancelled,
    HTTPStatusError,
    RedirectRefused,
    ResponseTooLarge,
    SGLangClient,
)
from .stats import IngestStats

log = logging.getLogger(__name__)

#: Ranks of the n-th polled server are offset by n * RANK_STRIDE so series stay apart.
RANK_STRIDE = 1000
#: Seconds a stopped poller goes on converting the answer it took (and cleared on the
#: server); what is left then is counted as `dropped_at_stop`, never silently lost.
DRAIN_SECONDS = 5.0


def read_api_key(path: Path | None = None) -> str | None:
    """SGLang's API key from a file or DSPARK_SGLANG_API_KEY; never from argv (ps shows argv)."""
    if path is not None:
        try:
            key = Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"--sglang-api-key-file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:  # the message names the file, never quotes its content
            raise ValueError(f"--sglang-api-key-file {path}: not UTF-8 text") from None
        if not key:
            raise ValueError(f"--sglang-api-key-file {path}: empty")
        return check_secret(key, f"--sglang-api-key-file {path}")
    key = os.environ.get("DSPARK_SGLANG_API_KEY")
    return check_secret(key, "$DSPARK_SGLANG_API_KEY") if key else None


class SGLangPoller:
    def __init__(
        self,
        url: str,
        *,
        stats: IngestStats,
        index: int = 0,
        interval: float = 1.0,
        timeout: float = 5.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        api_key: str | None = None,
        clear: bool = True,
        gamma: int = 7,
        workload_of: Callable[[np.ndarray], np.ndarray] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        drain_seconds: float = DRAIN_SECONDS,
    ) -> None:
        self.url = url.rstrip("/")
        self.name = f"sglang:{self.url}"
        self.stats = stats
        self.rank_offset = index * RANK_STRIDE
        self.interval, self.timeout = interval, timeout
        self.retries, self.backoff, self.max_backoff = retries, backoff, max_backoff
        self.clear = clear
        self.gamma = gamma
        # for both conversions (their default: no workload)
        self._workload = {} if workload_of is None else {"workload_of": workload_of}
        self.client = SGLangClient(self.url, api_key, timeout, max_bytes)
        #: the newest step taken of each rank, as the server numbers it
        self.last_fct: dict[int, int] = {}
        #: what each rank's step numbers are shifted by: the steps of its earlier lives
        self.fct_offset: dict[int, int] = {}
        #: whether the answer before this one was cleared on the server (so this one holds
        #: only newer steps, and an older one means a restart)
        self._drained = False
        #: the record text of each rank's newest step taken: without draining, the next
        #: answer holds it again unless the server restarted
        self._last_text: dict[int, bytes] = {}
        self.dropped_steps = 0
        self.duplicates = 0
        self.dropped_at_stop = 0
        self.drain_seconds = drain_seconds
        self._drain_until: float | None = None
        self.mode: str | None = None  # as the server reports it, once read
        self.timed = False  # whether its records carry step times
        self._reported: set[str] = set()

    # -- HTTP ----------------------------------------------------------------

    def _fault(self, exc: BaseException) -> str:
        if isinstance(exc, (ResponseTooLarge, RedirectRefused, InvalidBatch)):
            return exc.reason
        if isinstance(exc, HTTPStatusError):
            return f"http_{exc.code}"
        if isinstance(exc, TimeoutError):
            return "timeout"
        if isinstance(exc, (msgspec.DecodeError, ValueError)):
            return "bad_json"
        if isinstance(exc, OSError):
            return "connect_failed"
        return "poll_failed"

    def _decode(self, raw: bytes | bytearray) -> list[Raw | None]:
        """Each rank's record as JSON text (None for a rank without one): records are
        converted a chunk at a time from their text (`server_info_raw`), never as a Python
        object per number."""
        try:
            ranks = answer_records(raw)
        except msgspec.DecodeError as exc:
            raise ValueError(f"truncated or invalid JSON ({exc})") from None
        check_rank_count(ranks)
        return ranks

    def _clear(self, stop: threading.Event) -> bool:
        """Clear the server's records; whether it did."""
        try:
            self.client.clear_records(stop)
        except Cancelled:
            return False  # stopping: the answer in hand is converted all the same
        except Exception as exc:
            self.stats.error(self.name, "clear_failed", repr(exc))
            return False
        return True

    def _report_once(self, key: str, message: str) -> None:
        if key not in self._reported:
            self._reported.add(key)
            log.warning("%s: %s", self.name, message)

    # -- the stream ------------------------------------------------------------

    def batches(self, stop: threading.Event) -> Iterator[StepBatch]:
        failures = 0
        while not stop.is_set():
            start = time.monotonic()
            try:
                raw = self.client.request("/server_info", cancel=stop)
                # Drain at once: what a rank records between the read and the clear is lost,
                # so nothing (decoding a large answer, ingesting it) may sit in between.
                # HTTP framing already guarantees the answer arrived whole.
                drained = self.clear and self._clear(stop)
                states = self._decode(raw)
            except Cancelled:
                return  # stopped before an answer was taken: nothing to drain
            except Exception as exc:  # every failure is counted and retried, never raised
                failures += 1
                self.stats.set_up(self.name, False)
                self.stats.error(self.name, self._fault(exc), repr(exc))
                if isinstance(exc, ResponseTooLarge) and self.clear:
                    # A buffer too large to read stays too large unless drained: drop it so
                    # the next poll can succeed; the steps lost show up as dropped_steps.
                    self._clear(stop)
                delay = (
                    self.interval
                    if failures <= self.retries
                    else min(self.max_backoff, self.backoff * 2 ** (failures - self.retries))
                )
                stop.wait(delay)
                continue
            failures = 0
            self.stats.set_up(self.name, True)
            yield from self._records(states, stop)
            self._drained = drained
            del raw, states  # not held through the wait
            stop.wait(max(0.0, self.interval - (time.monotonic() - start)))

    def _stopping(self, stop: threading.Event | None) -> bool:
        """Whether the drain after a stop has run out of time: the rest is counted, not read."""
        if stop is None or not stop.is_set():
            return False
        if self._drain_until is None:
            self._drain_until = time.monotonic() + self.drain_seconds
        return time.monotonic() > self._drain_until

    def _records(
        self, ranks: list[Raw | None], stop: threading.Event | None = None
    ) -> Iterator[StepBatch]:
        for dp_rank, record in enumerate(ranks):
            if record is None:
                self._report_once(
                    f"norecord{dp_rank}",
                    f"rank {dp_rank} has no dspark_info_record (DSpark off, or "
                    "SGLANG_DSPARK_DEBUG_DUMP unset)",
                )
                continue
            try:
                dump = rank_records(record)
            except SGLangFormatError as exc:
                self.stats.error(self.name, "bad_envelope", f"rank {dp_rank}: {exc}")
                continue
            self._note_envelope(dump.fields["mode"], dump.fields["components"])
            yield from self._rank_steps(dp_rank, dump, stop)

    def _rank_steps(
        self, dp_rank: int, dump: RankRecords, stop: threading.Event | None
    ) -> Iterator[StepBatch]:
        """A rank's new steps, oldest first, converted a chunk at a time so that a large
        answer never exists as steps all at once."""
        rank = self.rank_offset + dp_rank
        fields, records, fcts = dump
        valid = fcts[fcts >= 0]
        last = self.last_fct.get(rank)
        if len(valid) and last is not None and self._restart_seen(rank, last, fcts, records):
            self._restarted(rank, dp_rank, last, int(valid.min()))
        before = self.last_fct.get(rank)
        in_order = len(fcts) < 2 or bool((fcts[1:] >= fcts[:-1]).all())
        order = np.arange(len(fcts)) if in_order else np.argsort(fcts, kind="stable")
        done = 0
        for chunk in chunks(records, order):
            if self._stopping(stop):
                lost = int((fcts[order[done:]] > self.last_fct.get(rank, -1)).sum())
                self.dropped_at_stop += lost
                self.stats.error(
                    self.name,
                    "dropped_at_stop",
                    f"{lost:,} steps taken from the server but not converted within "
                    f"{self.drain_seconds:g} s of the stop",
                    count=lost,
                )
                return
            done += len(chunk)
            texts = [records[i] for i in chunk.tolist()]
            steps = convert_records(texts, fields, rank, self._refuse, **self._workload)
            yield from self._fresh(rank, dp_rank, steps)
        newest = self.last_fct.get(rank)
        taken = np.flatnonzero(fcts == newest) if newest != before else ()
        if len(taken):
            self._last_text[rank] = bytes(records[int(taken[-1])])

    def _restart_seen(self, rank: int, last: int, fcts: np.ndarray, records: list[Raw]) -> bool:
        """Whether this answer of a rank whose newest step taken is `last` comes from a new
        life of its server."""
        valid = fcts[fcts >= 0]
        if self._drained:
            return bool(valid.min() <= last)
        if valid.max() < last:
            return True
        again = np.flatnonzero(fcts == last)
        text = self._last_text.get(rank)
        return (
            bool(len(again))
            and text is not None
            and all(bytes(records[i]) != text for i in again.tolist())
        )

    def _restarted(self, rank: int, dp_rank: int, last: int, first: int) -> None:
        """The rank's server restarted: its new steps are numbered after the old ones."""
        offset = self.fct_offset[rank] = self.fct_offset.get(rank, 0) + last + 1
        del self.last_fct[rank]
        message = (
            f"rank {dp_rank}: step counter went back from {last} to {first}; the server "
            f"restarted, and its steps are stored from here on as forward_ct + {offset} so "
            "that they follow, not mix with, the steps of its earlier run"
        )
        self._report_once(f"restart{rank}", message)
        self.stats.error(self.name, "server_restart", message)

    def _refuse(self, exc: SGLangFormatError) -> None:
        self.stats.error(self.name, exc.reason, str(exc))

    def _note_envelope(self, mode: str, components: list) -> None:
        self.mode = mode
        self.timed |= bool({"step_cpu_time", "step_gpu_time"} & set(components))
        if "reqs" not in components:
            self._report_once(
                "noreqs",
                "records carry no `reqs` component: per-request "
                "metrics (windows, ceilings, calibration) are unavailable",
            )

    def _fresh(self, rank: int, dp_rank: int, steps: list[StepBatch]) -> Iterator[StepBatch]:
        """The steps this rank has not delivered yet (given oldest first); duplicates and
        gaps are counted, and a jump no rank makes is counted as such, never as a gap."""
        for step in steps:
            last = self.last_fct.get(rank)
            if last is not None and step.forward_ct <= last:
                self.duplicates += 1
                continue
            if last is not None and step.forward_ct > last + 1:
                gap = step.forward_ct - last - 1
                if gap > MAX_STEP_GAP:
                    self.stats.error(
                        self.name,
                        "forward_ct_jump",
                        f"rank {dp_rank}: step counter jumped from {last} to "
                        f"{step.forward_ct}; followed from there, not counted as lost steps",
                    )
                else:
                    self.dropped_steps += gap
                    self.stats.error(self.name, "dropped_steps", f"{gap} steps missing", count=gap)
            self.last_fct[rank] = step.forward_ct
            step.forward_ct += self.fct_offset.get(rank, 0)
            yield step
