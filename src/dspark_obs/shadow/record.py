"""A shadow replay stored as a run: production's steps with the twin's ceilings joined in.

The run is what `estimate` evaluates: every walk and the population model against the
joined truth, for the traffic the operator chose to replay.
"""

from __future__ import annotations

from pathlib import Path

from ..pipeline import build_pipeline
from ..store import RunWriter
from ..telemetry.server_info import WorkloadOf
from .replay import Server, ShadowStats, load_requests, run_shadow


def record_shadow_run(
    production_url: str,
    shadow_url: str,
    requests_path: Path,
    out: Path,
    *,
    api_key: str | None,
    sample: float,
    seed: int,
    keep_sampling: bool,
    concurrency: int,
    workload_of: WorkloadOf,
) -> ShadowStats:
    """Replay a sample of `requests_path` on both servers and store the joined run in `out`."""
    if not 0 < sample <= 1:
        raise ValueError("--sample must be within (0, 1]")
    requests = load_requests(requests_path)
    if not requests:
        raise ValueError(f"{requests_path}: no requests")
    try:
        batches, stats = run_shadow(
            Server(production_url, api_key, timeout=600),
            Server(shadow_url, api_key, timeout=600),
            requests,
            sample=sample,
            seed=seed,
            keep_sampling=keep_sampling,
            concurrency=concurrency,
            workload_of=workload_of,
        )
    except OSError as exc:  # Server's errors name the URL
        raise ValueError(str(exc)) from None
    if not batches:
        raise ValueError("production returned no step records (is SGLANG_DSPARK_DEBUG_DUMP set?)")
    gamma = batches[0].gamma
    manifest = {
        "source": "shadow",
        "production": production_url,
        "shadow": shadow_url,
        "gamma": gamma,
        "mode": batches[0].mode,
        "shadow_mode": "cap-accept",
        "sample": sample,
        "greedy": not keep_sampling,
        "timing": "measured",
    }
    pipeline = build_pipeline(
        gamma, writer=RunWriter(out, manifest), assume_greedy=not keep_sampling
    )
    for b in batches:
        pipeline.ingest(b, "shadow")
    pipeline.close(
        {
            "requests_replayed": stats.requests,
            "joined_rows": stats.joined_rows,
            "production_rows": stats.production_rows,
        }
    )
    return stats
