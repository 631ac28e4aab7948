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
once a later step of the rank arrives.

A step counter that goes backwards means the server restarted: the rank starts
over. Gaps are counted as dropped steps. A component the server does not dump
(no `reqs`: no per-request metrics) is reported once, clearly. Every failure
(connection refused, timeout, HTTP error, truncated JSON, an answer over the
byte limit, a record that breaks the schema) is counted by reason and logged
once per reason; the poller backs off and keeps trying, and `dspark_source_up`
says whether it is getting data.

A rank's records are converted in one pass over their JSON text (the compiled
parser where it is built): at B = 256 a record-by-record conversion costs
milliseconds per step, more than a busy server's step rate allows. A rank whose
records are not all plainly valid goes record by record instead, so that each
bad record is counted by its reason and the rest are kept.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import numpy as np
from msgspec import Raw

from ..telemetry import StepBatch
from ..telemetry.batch import InvalidBatch
from ..telemetry.server_info import (
    SGLangFormatError,
    check_rank_count,
    decode_info_record,
    decode_step_record,
    info_record_to_batches,
    record_to_batch,
)
from .sglang_http import DEFAULT_MAX_BYTES, ResponseTooLarge, SGLangClient
from .stats import IngestStats

log = logging.getLogger(__name__)

#: Ranks of the n-th polled server are offset by n * RANK_STRIDE so series stay apart.
RANK_STRIDE = 1000


class _ServerInfo(msgspec.Struct):
    """`GET /server_info`, each rank's state kept as its JSON text: only the record is read."""

    internal_states: list[Raw]


class _RankState(msgspec.Struct):
    dspark_info_record: Raw = Raw(b"null")


class _Envelope(msgspec.Struct):
    """A `dspark_info_record` without its records, for a payload converted in one pass."""

    mode: str
    components: list[str]


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
        return key
    return os.environ.get("DSPARK_SGLANG_API_KEY") or None


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
        self.last_fct: dict[int, int] = {}
        self.dropped_steps = 0
        self.duplicates = 0
        self.mode: str | None = None  # as the server reports it, once read
        self.timed = False  # whether its records carry step times
        self._reported: set[str] = set()

    # -- HTTP ----------------------------------------------------------------

    def _fault(self, exc: BaseException) -> str:
        if isinstance(exc, ResponseTooLarge):
            return ResponseTooLarge.reason
        if isinstance(exc, InvalidBatch):
            return exc.reason
        if isinstance(exc, urllib.error.HTTPError):
            return f"http_{exc.code}"
        if isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError):
            return "timeout"
        if isinstance(exc, urllib.error.URLError):
            return "connect_failed"
        if isinstance(exc, (msgspec.DecodeError, ValueError)):
            return "bad_json"
        return "poll_failed"

    def _decode(self, raw: bytes) -> list[Raw]:
        """Each rank's state as JSON text: the records of a rank are converted in one pass
        over their text (`_rank_batches`), never as a Python object per number."""
        try:
            info = msgspec.json.decode(raw, type=_ServerInfo)
        except msgspec.ValidationError:
            raise SGLangFormatError("server_info has no internal_states list", "bad_json") from None
        except msgspec.DecodeError as exc:
            raise ValueError(f"truncated or invalid JSON ({exc})") from None
        check_rank_count(info.internal_states)
        return info.internal_states

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
                raw = self.client.request("/server_info")
                # Drain at once: what a rank records between the read and the clear is lost,
                # so nothing (decoding a large answer, ingesting it) may sit in between.
                # HTTP framing already guarantees the answer arrived whole.
                if self.clear:
                    try:
                        self.client.clear_records()
                    except Exception as exc:
                        self.stats.error(self.name, "clear_failed", repr(exc))
                states = self._decode(raw)
            except Exception as exc:  # every failure is counted and retried, never raised
                failures += 1
                self.stats.set_up(self.name, False)
                self.stats.error(self.name, self._fault(exc), repr(exc))
                if isinstance(exc, ResponseTooLarge) and self.clear:
                    # A buffer too large to read stays too large unless drained: drop it so
                    # the next poll can succeed; the steps lost show up as dropped_steps.
                    try:
                        self.client.clear_records()
                    except Exception as clear_exc:
                        self.stats.error(self.name, "clear_failed", repr(clear_exc))
                delay = (
                    self.interval
                    if failures <= self.retries
                    else min(self.max_backoff, self.backoff * 2 ** (failures - self.retries))
                )
                stop.wait(delay)
                continue
            failures = 0
            self.stats.set_up(self.name, True)
            yield from self._records(states)
            stop.wait(max(0.0, self.interval - (time.monotonic() - start)))

    def _records(self, states: list[Raw]) -> Iterator[StepBatch]:
        for dp_rank, state_raw in enumerate(states):
            rank = self.rank_offset + dp_rank
            try:
                record_raw = msgspec.json.decode(state_raw, type=_RankState).dspark_info_record
            except msgspec.ValidationError:  # a state that is not an object has no record
                record_raw = Raw(b"null")
            if bytes(record_raw) != b"null":
                batches = self._rank_batches(record_raw, rank)
                if batches is not None:
                    yield from self._fresh(rank, dp_rank, batches)
                    continue
            # anything the one-pass conversion does not take, record by record: one bad
            # record must not cost the rest, and each is counted by its reason
            info_raw = msgspec.json.decode(record_raw)
            if info_raw is None:
                self._report_once(
                    f"norecord{dp_rank}",
                    f"rank {dp_rank} has no "
                    "dspark_info_record (DSpark off, or SGLANG_DSPARK_DEBUG_DUMP "
                    "unset)",
                )
                continue
            # the envelope first, then record by record: one bad record must not cost the rest
            raw_records = info_raw.get("records") if isinstance(info_raw, dict) else None
            try:
                info = decode_info_record({**info_raw, "records": []})
            except (SGLangFormatError, TypeError) as exc:
                self.stats.error(self.name, "bad_envelope", str(exc))
                continue
            for raw in raw_records if isinstance(raw_records, list) else []:
                try:
                    info.records.append(decode_step_record(raw))
                except SGLangFormatError as exc:
                    self.stats.error(self.name, exc.reason, str(exc))
            self._note_envelope(info.mode, info.components)
            for rec in self._fresh(rank, dp_rank, info.records):
                try:
                    yield record_to_batch(
                        rec, gamma=info.gamma, mode=info.mode, rank=rank, **self._workload
                    )
                except SGLangFormatError as exc:
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

    def _rank_batches(self, record_raw: Raw, rank: int) -> list[StepBatch] | None:
        """A rank's steps converted in one pass, or None where a record needs a closer look."""
        try:
            batches = info_record_to_batches(bytes(record_raw), rank=rank, **self._workload)
            envelope = msgspec.json.decode(record_raw, type=_Envelope)
        except (InvalidBatch, TypeError, ValueError, msgspec.MsgspecError):
            return None
        self._note_envelope(envelope.mode, envelope.components)
        return batches

    def _fresh(self, rank: int, dp_rank: int, steps: list) -> Iterator:
        """The steps (records or batches) this rank has not delivered yet, oldest first;
        a restart, duplicates and gaps are counted."""
        steps = sorted(steps, key=lambda r: r.forward_ct)
        if steps and rank in self.last_fct and steps[-1].forward_ct < self.last_fct[rank]:
            self._report_once(
                f"restart{rank}", f"rank {dp_rank}: step counter went back; server restarted"
            )
            self.stats.error(self.name, "server_restart", "step counter went backwards")
            del self.last_fct[rank]
        for step in steps:
            last = self.last_fct.get(rank)
            if last is not None and step.forward_ct <= last:
                self.duplicates += 1
                continue
            if last is not None and step.forward_ct > last + 1:
                gap = step.forward_ct - last - 1
                self.dropped_steps += gap
                self.stats.error(self.name, "dropped_steps", f"{gap} steps missing", count=gap)
            self.last_fct[rank] = step.forward_ct
            yield step
