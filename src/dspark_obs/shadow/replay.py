"""Shadow runs: the true ceiling for a sample of production traffic, from a cap-accept twin.

A cap-accept server verifies the whole block but commits only the window, so
for the same request it commits what compact commits and reports, per step,
what full verification would have accepted (`correct_drafts + cap_trim`).
Replaying a sample of requests on such a server and joining its steps to
production's by (rid, prefix_len) gives each production request-step its
ceiling.

The join is exact when both servers commit the same tokens: greedy decoding
(the default here, temperature 0) or sampling with a fixed seed on a
deterministic server; then every step of the request starts at the same
position with the same prefix. With free sampling the two streams part after
the first differing token: the join then covers only steps that happen to
share a position, and their ceilings agree only in distribution; the command
reports how many rows joined.
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..json_files import decode_json
from ..sources.sglang_http import SGLangClient
from ..telemetry import StepBatch
from ..telemetry.server_info import info_record_to_batches, server_info_ranks


@dataclass
class ShadowStats:
    offered: int  # requests in the file
    requests: int  # of them replayed
    production_rows: int
    joined_rows: int
    shadow_rows: int


def load_requests(path: Path) -> list[dict]:
    """JSONL of requests in SGLang's `/generate` shape, one per line, each with a `rid`."""
    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            req = decode_json(line.encode("utf-8"))
        except ValueError as exc:
            raise ValueError(f"{path}, line {n}: not JSON ({exc})") from None
        if (
            not isinstance(req, dict)
            or "rid" not in req
            or not ("text" in req or "input_ids" in req)
        ):
            raise ValueError(f"{path}, line {n}: needs rid and text or input_ids")
        out.append(req)
    return out


class Server(SGLangClient):
    def request(self, path: str, body: dict | None = None, cancel=None) -> bytes | bytearray:
        """As SGLangClient's, with the URL in the error: two servers are in play."""
        try:
            return super().request(path, body, cancel)
        except OSError as exc:
            reason = getattr(exc, "reason", None) or exc.strerror or exc
            raise OSError(f"cannot reach {self.url}{path}: {reason}") from None

    def call(self, path: str, body: dict | None = None):
        return json.loads(self.request(path, body))

    def clear(self) -> None:
        self.clear_records()

    def batches(self, workload_of) -> list[StepBatch]:
        out = []
        for rank, info in enumerate(server_info_ranks(self.request("/server_info"))):
            if info is not None:
                out += info_record_to_batches(info, rank=rank, workload_of=workload_of)
        return out


def _send(server: Server, requests: list[dict], concurrency: int) -> None:
    it = iter(requests)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        while True:
            with lock:
                req = next(it, None)
            if req is None:
                return
            try:
                server.call("/generate", req)
            except BaseException as exc:
                errors.append(exc)
                return

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        first = errors[0]
        raise ValueError(
            str(first) if isinstance(first, OSError) else f"{server.url}/generate: {first}"
        )


def run_shadow(
    production: Server,
    shadow: Server,
    requests: list[dict],
    *,
    sample: float,
    seed: int,
    keep_sampling: bool,
    concurrency: int,
    workload_of,
) -> tuple[list[StepBatch], ShadowStats]:
    """Replay a sample on both servers; production's steps with `shadow_ceiling` filled in."""
    # seeded sampling of which requests to replay: reproducible on purpose, nothing secret
    rng = random.Random(seed)  # nosec B311
    chosen = [r for r in requests if rng.random() < sample] or requests[:1]
    if not keep_sampling:
        chosen = [
            dict(r, sampling_params=dict(r.get("sampling_params", {}), temperature=0.0))
            for r in chosen
        ]
    for server in (production, shadow):
        server.clear()
    _send(production, chosen, concurrency)
    _send(shadow, chosen, concurrency)
    prod = production.batches(workload_of)
    twin = shadow.batches(workload_of)
    _check_twin(shadow.url, twin)
    truth: dict[tuple[str, int], int] = {}
    shadow_rows = 0
    for b in twin:
        shadow_rows += b.num_reqs
        ceiling = b.ceiling
        for rid, pos, c in zip(
            b.rid.tolist(), b.prefix_len.tolist(), ceiling.tolist(), strict=True
        ):
            truth[(rid, pos)] = c
    rows = joined = 0
    for b in prod:
        if not b.num_reqs:
            continue
        b.shadow_ceiling = np.array(
            [
                truth.get((rid, pos), -1)
                for rid, pos in zip(b.rid.tolist(), b.prefix_len.tolist(), strict=True)
            ],
            dtype=np.int64,
        )
        rows += b.num_reqs
        joined += int((b.shadow_ceiling >= 0).sum())
    if rows and not joined:
        raise ValueError(
            f"none of production's {rows:,} request-steps matched a shadow step by rid and "
            "position: the two servers committed different tokens (replay greedy, without "
            "--keep-sampling, on servers with the same model and draft)"
        )
    prod.sort(key=lambda b: (b.rank, b.forward_ct))
    return prod, ShadowStats(len(requests), len(chosen), rows, joined, shadow_rows)


def _check_twin(url: str, twin: list[StepBatch]) -> None:
    """The twin must reveal ceilings: a compact one joins nothing, a static one commits other
    tokens than production, so neither gives a truth worth storing."""
    if not twin:
        raise ValueError(f"{url} returned no step records (is SGLANG_DSPARK_DEBUG_DUMP set?)")
    modes = sorted({b.mode or "an unnamed" for b in twin} - {"cap-accept"})
    if modes:
        raise ValueError(
            f"{url} verifies in {', '.join(modes)} mode, not cap-accept, so its steps carry no "
            "ceiling to join: --shadow needs a server started in cap-accept verify mode"
        )
