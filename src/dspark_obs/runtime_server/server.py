"""An SGLang-protocol HTTP front for the reference runtime.

The poller, the dashboards and any client written against a real SGLang DSpark
server can then be exercised without a GPU: `/generate` drives requests
through the runtime, `/server_info` exposes per-rank `dspark_info_record`s in
SGLang's exact JSON, and `/set_internal_state` clears them the way SGLang does.

Each simulated data-parallel rank is one engine on its own thread, stepping
while it holds requests; requests go to ranks round-robin. The standard
library's threading server is enough: a request thread only parses, queues and
waits for its rank to finish the request.

This module holds the front itself (its ranks, its server and the three endpoints);
`ranks` steps the engines, `protocol` reads request bodies, `rate_limit` and `handler`
guard and route the HTTP requests.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import HTTPServer

from .. import __version__, names
from ..http_strict import BoundedThreadingServer
from ..runtime.config import RuntimeConfig
from ..telemetry.server_info import MAX_DP_RANKS
from .handler import make_handler
from .protocol import ClientGone, RequestError, byte_text, detokenize, parse_generate
from .ranks import MAX_RECORDS, Rank
from .rate_limit import DEFAULT_RATE_LIMIT, RateLimiter

log = logging.getLogger(__name__)

#: How often a waiting `/generate` checks that its client is still connected.
_GONE_POLL_S = 0.25


#: How often the serving loop looks for a stop. `stop()` waits for the loop's next look:
#: with socketserver's half second, a quarter of a second a stop on average, which the
#: tests, started and stopped by the dozen, paid each time; the idle loop's twenty looks a
#: second cost it about 2 ms of CPU a second (0.5 ms at two looks a second).
STOP_POLL_SECONDS = 0.05


class _Server(BoundedThreadingServer, HTTPServer):
    label = "runtime-server"
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
        #: rids and workload names `/generate` cleaned to keep (`names.clean`)
        self.names_cleaned = 0
        self.httpd = _Server((host, port), make_handler(self))
        #: requests and connections refused, by reason (http_strict)
        self.refusals = self.httpd.refusals
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
            target=self.httpd.serve_forever, args=(STOP_POLL_SECONDS,),
            name="dspark-runtime-server", daemon=True,
        )  # fmt: skip
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

    def generate(self, body, gone: Callable[[], bool] | None = None) -> dict | list:
        """The answer to a `/generate` body; `gone` says whether the client hung up.

        While waiting, `gone` is asked every `_GONE_POLL_S`: once the client has gone,
        its requests are stopped (a client that times out on a long `ignore_eos`
        request must not leave it generating) and ClientGone is raised.
        """
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        reqs, batched, cleaned = parse_generate(body)
        if cleaned:
            self._names_cleaned(cleaned)
        ranks = self.ranks
        try:  # all validated before any is queued: a bad batch runs nothing
            checked = [ranks[0].engine.external_request(kw.pop("rid"), **kw) for kw in reqs]
        except ValueError as exc:
            raise RequestError(str(exc)) from None
        submitted, used = [], []
        for req in checked:
            with self._rr_lock:
                rank = ranks[next(self._next_rank) % len(ranks)]
            start = time.perf_counter()
            submitted.append((rank.submit(req), start))
            used.append(rank)
        answers = []
        text_of = byte_text if ranks[0].engine.byte_vocabulary else detokenize
        for waiter, start in submitted:
            while not waiter.done.wait(_GONE_POLL_S):
                if gone is not None and gone():
                    for r, k in zip(checked, used, strict=True):
                        k.abort({r.rid})
                    raise ClientGone(f"client went away; {len(checked)} requests stopped")
            if waiter.error is not None:
                raise RequestError(waiter.error, HTTPStatus.SERVICE_UNAVAILABLE)
            f = waiter.result
            answers.append(
                {
                    "text": text_of(f.output_ids),
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

    def _names_cleaned(self, n: int) -> None:
        with self._rr_lock:
            first, self.names_cleaned = not self.names_cleaned, self.names_cleaned + n
        if first:
            log.warning(
                "/generate: a rid or workload name with unprintable characters or over %d "
                "characters was cleaned to be kept (names.clean); further ones are only "
                "counted",
                names.MAX_LEN,
            )

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
