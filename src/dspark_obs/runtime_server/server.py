"""An SGLang-protocol HTTP front for the reference runtime.

The poller, the dashboards and any client written against a real SGLang DSpark
server can then be exercised without a GPU: `/generate` drives requests
through the runtime, `/server_info` exposes per-rank `dspark_info_record`s in
SGLang's exact JSON, and `/set_internal_state` clears them the way SGLang does.

Each simulated data-parallel rank is one engine on its own thread, stepping
while it holds requests; requests go to ranks round-robin. The standard
library's threading server is enough: a request thread only parses, queues and
waits for its rank to finish the request.
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import math
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import msgspec

from .. import __version__
from ..runtime.config import RuntimeConfig
from ..runtime.engine import DSparkRuntime, ExternalRequest, FinishedRequest
from ..telemetry.server_info import MAX_DP_RANKS, batch_to_record, batches_to_info_record

log = logging.getLogger(__name__)

#: What this front dumps, as `SGLANG_DSPARK_DEBUG_DUMP=core,reqs,step_gpu_time,step_cpu_time`.
COMPONENTS = ("core", "reqs", "step_cpu_time", "step_gpu_time")
MAX_RECORDS = 200_000
MAX_BODY = 1 << 20
#: Requests per second per client address before 429: far above what a poller (1/s) or a
#: benchmark client of the simulated runtime needs, low enough to blunt a runaway loop or
#: an API-key guessing script.
DEFAULT_RATE_LIMIT = 200.0
#: SGLang's default when `sampling_params` gives none.
DEFAULT_MAX_NEW_TOKENS = 128
_ALPHABET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'-()\n"


class RequestError(ValueError):
    """A client mistake, answered with its HTTP status and never raised past the handler."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def detokenize(ids: list[int]) -> str:
    """A stand-in for the tokenizer: synthetic tokens have no text, only a stable spelling."""
    return "".join(_ALPHABET[t % len(_ALPHABET)] for t in ids)


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
        self.engine = DSparkRuntime(config)
        self.speed = speed
        self.records: deque = deque(maxlen=max_records)
        self.steps = 0
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


class RateLimiter:
    """A token bucket per client address: `rate` requests per second, bursts up to `burst`.

    Buckets are kept per address only while they matter: once more than
    `max_clients` are tracked, buckets that have refilled completely (idle
    clients) are forgotten, so a scan from many addresses cannot grow memory
    without bound.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock=time.monotonic,
        max_clients: int = 10_000,
    ) -> None:
        if not math.isfinite(rate) or rate < 0:
            raise ValueError("--rate-limit must be a finite number >= 0 (0 disables it)")
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.clock = clock
        self.max_clients = max_clients
        self.refused = 0
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)
        self._lock = threading.Lock()

    def wait(self, client: str) -> float:
        """0 when `client` may go ahead (a token is taken), else seconds until it may."""
        if self.rate <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                if len(self._buckets) > self.max_clients:
                    self._forget_idle(now)
                return 0.0
            self._buckets[client] = (tokens, now)
            self.refused += 1
            if self.refused == 1:
                log.warning(
                    "client %s went over --rate-limit %g/s (answered 429); "
                    "further refusals are only counted",
                    client,
                    self.rate,
                )
            return (1.0 - tokens) / self.rate

    def _forget_idle(self, now: float) -> None:
        full = [
            c
            for c, (tokens, at) in self._buckets.items()
            if tokens + (now - at) * self.rate >= self.burst
        ]
        for c in full:
            del self._buckets[c]


def _as_list(value, n: int, what: str) -> list:
    """Broadcast a per-request field of a batch request (SGLang lets one value serve all)."""
    if isinstance(value, list):
        if len(value) != n:
            raise RequestError(f"{what}: {len(value)} values for {n} prompts")
        return value
    return [value] * n


def parse_generate(body: dict) -> tuple[list[dict], bool]:
    """SGLang's `/generate` body as per-request keyword sets, and whether it was a batch."""
    if body.get("stream"):
        raise RequestError("streaming is not supported by the reference front")
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise RequestError("give exactly one of text or input_ids")
    if text is not None:
        batched = isinstance(text, list)
        prompts = [{"text": t} for t in (text if batched else [text])]
    else:
        batched = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        prompts = [{"input_ids": t} for t in (input_ids if batched else [input_ids])]
    n = len(prompts)
    if n == 0:
        raise RequestError("empty batch")
    params = _as_list(body.get("sampling_params") or {}, n, "sampling_params")
    rids = body.get("rid")
    rids = [uuid.uuid4().hex for _ in range(n)] if rids is None else _as_list(rids, n, "rid")
    workloads = _as_list(body.get("workload"), n, "workload")
    out = []
    for prompt, sp, rid, wl in zip(prompts, params, rids, workloads, strict=True):
        if not isinstance(sp, dict):
            raise RequestError("sampling_params must be an object")
        if wl is not None and not isinstance(wl, str):
            raise RequestError("workload must be a string")
        out.append(
            {
                **prompt,
                "rid": rid,
                "temperature": sp.get("temperature", 1.0),
                "max_new_tokens": sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
                "ignore_eos": bool(sp.get("ignore_eos", False)),
                "workload": wl,
            }
        )
    if len({r["rid"] for r in out}) != n:
        raise RequestError("rids repeat within the batch")
    return out, batched


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The standard library's backlog of 5 drops (and, under load, resets) connections when a
    # benchmark or a shadow replay opens dozens at once; they should wait in the queue.
    request_queue_size = 128


class RuntimeFrontend:
    """The ranks and the HTTP server in front of them."""

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        host: str = "127.0.0.1",
        port: int = 30000,
        dp_size: int = 1,
        speed: float = 0.0,
        api_key: str | None = None,
        max_records: int = MAX_RECORDS,
        rate_limit: float = DEFAULT_RATE_LIMIT,
    ) -> None:
        if not 1 <= dp_size <= MAX_DP_RANKS:
            raise ValueError(f"--dp-size must be within 1..{MAX_DP_RANKS}")
        if speed < 0:
            raise ValueError("--speed must be >= 0")
        if max_records < 1:
            raise ValueError("max records must be >= 1")
        self.config = config
        self.api_key = api_key
        self.limiter = RateLimiter(rate_limit)
        self.ranks = [Rank(i, config, speed, max_records) for i in range(dp_size)]
        self._next_rank = itertools.count()
        self._rr_lock = threading.Lock()
        self.httpd = _Server((host, port), _make_handler(self))
        self._serve_thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}"

    def start(self) -> str:
        for r in self.ranks:
            r.start()
        self._serve_thread = threading.Thread(
            target=self.httpd.serve_forever, name="dspark-runtime-server", daemon=True
        )
        self._serve_thread.start()
        return self.url

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        for r in self.ranks:
            r.stop()

    def __enter__(self) -> RuntimeFrontend:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- endpoints -------------------------------------------------------------------------

    def generate(self, body) -> dict | list:
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        reqs, batched = parse_generate(body)
        ranks = self.ranks
        try:  # all validated before any is queued: a bad batch runs nothing
            checked = [ranks[0].engine.external_request(kw.pop("rid"), **kw) for kw in reqs]
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        submitted = []
        for req in checked:
            with self._rr_lock:
                rank = ranks[next(self._next_rank) % len(ranks)]
            start = time.perf_counter()
            submitted.append((rank.submit(req), start))
        answers = []
        for waiter, start in submitted:
            waiter.done.wait()
            if waiter.error is not None:
                raise RequestError(waiter.error, HTTPStatus.SERVICE_UNAVAILABLE)
            f = waiter.result
            answers.append(
                {
                    "text": detokenize(f.output_ids),
                    "output_ids": f.output_ids,
                    "meta_info": {
                        "id": f.rid,
                        "finish_reason": f.finish_reason,
                        "prompt_tokens": f.prompt_tokens,
                        "completion_tokens": len(f.output_ids),
                        "cached_tokens": 0,
                        "spec_verify_ct": f.verify_ct,
                        "e2e_latency": time.perf_counter() - start,
                    },
                }
            )
        return answers if batched else answers[0]

    def server_info(self) -> dict:
        c = self.config
        return {
            "version": f"dspark-obs-{__version__}",
            "speculative_algorithm": "DSPARK",
            "speculative_num_draft_tokens": c.gamma + 1,
            "dp_size": len(self.ranks),
            "ragged_verify_mode": c.mode,
            "internal_states": [r.info_record() for r in self.ranks],
        }

    def set_internal_state(self, body) -> list[dict]:
        """SGLang's answer, one object per rank; only the DSpark switches are known here.

        `dspark_force_budget_frac` is stored and reported back in `/server_info`
        but does not steer the reference scheduler.
        """
        if not isinstance(body, dict) or not isinstance(body.get("server_args"), dict):
            raise RequestError('expected {"server_args": {...}}')
        args = body["server_args"]
        unknown = sorted(set(args) - {"dspark_clear_info_records", "dspark_force_budget_frac"})
        if unknown:
            return [
                {"updated": False, "error": f"unknown server_args {unknown}"} for _ in self.ranks
            ]
        frac = args.get("dspark_force_budget_frac", ...)
        if frac is not ... and frac is not None:
            if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
                raise RequestError("dspark_force_budget_frac must be null or within [0, 1]")
        for r in self.ranks:
            if args.get("dspark_clear_info_records"):
                r.clear_records()
            if frac is not ...:
                r.force_budget_frac = None if frac is None else float(frac)
        return [{"updated": True, "server_args": args} for _ in self.ranks]


def _make_handler(front: RuntimeFrontend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = f"dspark-obs-runtime-server/{__version__}"

        def log_message(self, format, *args) -> None:
            log.debug("%s %s", self.address_string(), format % args)

        def _send(self, status: int, payload) -> None:
            data = msgspec.json.encode(payload)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:  # a body left unread: tell the client, then hang up
                self.send_header("Connection", "close")
            if status == HTTPStatus.UNAUTHORIZED:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "code": int(status)}})

        def _authorized(self) -> bool:
            if front.api_key is None or self.path.split("?")[0] == "/health":
                return True
            got = self.headers.get("Authorization", "")
            return hmac.compare_digest(got.encode(), f"Bearer {front.api_key}".encode())

        def _body(self):
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                raise RequestError("chunked bodies are not accepted", HTTPStatus.LENGTH_REQUIRED)
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self.close_connection = True
                raise RequestError("bad Content-Length") from None
            if n > MAX_BODY:
                self.close_connection = True  # the body stays unread
                raise RequestError(
                    f"body over {MAX_BODY} bytes", HTTPStatus.REQUEST_ENTITY_TOO_LARGE
                )
            raw = self.rfile.read(n) if n > 0 else b""
            try:
                return json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise RequestError(f"invalid JSON body: {exc}") from None

        def _limited(self, method: str) -> bool:
            """Answer 429 (with Retry-After) when this client is over --rate-limit."""
            wait = front.limiter.wait(self.client_address[0])
            if not wait:
                return False
            data = msgspec.json.encode(
                {"error": {"message": "too many requests", "code": HTTPStatus.TOO_MANY_REQUESTS}}
            )
            self.send_response(HTTPStatus.TOO_MANY_REQUESTS)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Retry-After", str(max(1, math.ceil(wait))))
            if method == "POST":  # its body stays unread: the connection cannot be reused
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            return True

        def _dispatch(self, method: str) -> None:
            path = self.path.split("?")[0]
            try:
                # before authentication, so that a key-guessing loop is slowed down as well
                if self._limited(method):
                    return
                if not self._authorized():
                    if method == "POST":
                        self.close_connection = True
                    self._error(HTTPStatus.UNAUTHORIZED, "missing or wrong API key")
                    return
                if method == "GET" and path in ("/health", "/health_generate"):
                    self._send(HTTPStatus.OK, {})
                elif method == "GET" and path in ("/server_info", "/get_server_info"):
                    self._send(HTTPStatus.OK, front.server_info())
                elif method == "POST" and path == "/generate":
                    self._send(HTTPStatus.OK, front.generate(self._body()))
                elif method == "POST" and path == "/set_internal_state":
                    self._send(HTTPStatus.OK, front.set_internal_state(self._body()))
                else:
                    self._error(HTTPStatus.NOT_FOUND, f"no {method} {path}")
            except RequestError as exc:
                self._error(exc.status, str(exc))
            except Exception as exc:  # a bug answers 500; the server stays up
                log.exception("%s %s failed", method, path)
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, repr(exc))

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

    return Handler
