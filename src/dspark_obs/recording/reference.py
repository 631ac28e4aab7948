"""The reference runtime recorded into a run directory, every step through one pipeline.

The aggregates and the ceiling estimator see each step in band (the estimator gathers
from the runtime's own verify distributions), so a recorded run's `ceilings` table is
what a live deployment would have estimated; `serve` runs the same runtime as a live
source instead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from ..calibration import StsCalibration, save_sts
from ..pipeline import Pipeline, build_pipeline
from ..runtime.config import RuntimeConfig
from ..runtime.factory import make_runtime
from ..store import RunWriter
from ..store.provenance import versions
from ..telemetry import StepBatch
from ..telemetry.block_accept_writer import BlockAcceptWriter
from .block_accept import write_block_accept_step


def default_run_dir(label: str) -> Path:
    """`runs/TIME-LABEL`: a new directory per invocation, sortable by start time."""
    return Path("runs") / f"{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{label}"


def runtime_manifest(config: RuntimeConfig, sts: StsCalibration | None) -> dict:
    """What a run of the reference runtime records about itself in `run.json`."""
    return {
        "format": 1,
        "source": "runtime",
        "engine": "reference",
        "model_name": f"dspark-obs/{config.world}",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": versions(),
        "seed": config.seed,
        "gamma": config.gamma,
        "mode": config.mode,
        "shadow": config.shadow,
        "world": config.world,
        "workloads": [w.name for w in config.workloads],
        "timing": config.timing,
        "target": config.target,
        "cost_table": config.manifest()["cost_table"],
        "sts": None
        if sts is None
        else {
            "temperatures": sts.temperatures,
            "ece_before": sts.ece_before,
            "ece_after": sts.ece_after,
            "num_samples": sts.num_samples,
        },
        "config": config.manifest(),
    }


def record_reference_run(
    config: RuntimeConfig,
    out: Path,
    sts: StsCalibration | None,
    *,
    on_step: Callable[[StepBatch], object] | None = None,
    on_pipeline: Callable[[Pipeline], object] | None = None,
    stop: threading.Event | None = None,
    store: dict | None = None,
    sglang_jsonl: Path | None = None,
) -> Path:
    """Run the runtime's concurrency sweep to its end (or until `stop` is set) into `out`.

    `on_pipeline` gets the pipeline before the first step (the demo serves it);
    `on_step` sees every step after it was taken in (a progress bar). A run ended by
    `stop` is flushed and closed like a finished one, with `interrupted: true` in its
    manifest. `store` holds RunWriter options (flush interval). `sglang_jsonl` names a
    new file to receive the run as SGLang's block-accept estimator JSONL.
    """
    if sts is not None:
        config.sts_temperatures = list(sts.temperatures)
    runtime = make_runtime(config)
    start = time.perf_counter()
    # opened first: a file that cannot be created is refused before a run directory exists
    jsonl = None if sglang_jsonl is None else BlockAcceptWriter(sglang_jsonl, config.gamma)
    writer = RunWriter(out, runtime_manifest(config, sts), **(store or {}))
    if sts is not None:
        save_sts(sts, out / "sts.json")
    pipeline = build_pipeline(
        config.gamma,
        writer=writer,
        cost_table=config.cost_table,
        capture_tiers=tuple(config.capture_tiers),
    )
    if on_pipeline is not None:
        on_pipeline(pipeline)
    interrupted = False
    try:
        for batch in runtime.run():
            pipeline.ingest(batch, "runtime", runtime.gather_target_logprobs)
            if jsonl is not None:
                write_block_accept_step(jsonl, runtime, batch)
            if on_step is not None:
                on_step(batch)
            if stop is not None and stop.is_set():
                interrupted = True
                break
    finally:
        if jsonl is not None:
            jsonl.close()
        pipeline.close(
            {
                "wall_seconds": round(time.perf_counter() - start, 3),
                "requests_arrived": runtime.arrived,
                "requests_finished": runtime.finished,
            }
            | ({"interrupted": True} if interrupted else {})
        )
    return out
