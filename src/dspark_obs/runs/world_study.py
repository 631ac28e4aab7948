"""The world study's driver: reference runs over worlds and seeds, each summarised by
`dspark_obs.estimator.study` (all-step mean ceilings against the shadow twin's truth).

It lives beside the runs it records, not in the estimator, which must not depend on the
runtime that exercises it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..estimator.study import all_step_means, jsonl_all_step_means
from ..runtime.config import RuntimeConfig
from ..runtime.sts_warmup import resolve_sts
from ..store import open_run
from .reference import record_reference_run

#: the warm-up `dspark-obs run --sts auto` fits STS on by default
STS_WARMUP_STEPS = 150


def world_study(worlds: list[str], seeds: list[int], *, concurrency: int = 64,
                steps: int = 200, sts: str = "auto") -> list[dict]:  # fmt: skip
    """One record per (world, seed, path, workload, method) of a compact run with a shadow
    twin: `path` is `in-band` (the run's own walks) or `jsonl` (the walk over the
    block-accept JSONL the run wrote, as SGLang's recorder writes it; sampled requests).
    `sts` as `dspark-obs run --sts` takes it (the default fits STS on a warm-up run, as
    a run does)."""
    records = []
    for world in worlds:
        for seed in seeds:
            config = RuntimeConfig(seed=seed, world=world, shadow="cap-accept",
                                   concurrency=[concurrency], steps_per_level=steps)  # fmt: skip
            with tempfile.TemporaryDirectory() as tmp:
                out, jsonl = Path(tmp) / "run", Path(tmp) / "block_accept.jsonl"
                calibration = resolve_sts(sts, config, STS_WARMUP_STEPS)
                record_reference_run(config, out, calibration, sglang_jsonl=jsonl)
                run = open_run(out)
                paths = {"in-band": all_step_means(run), "jsonl": jsonl_all_step_means(jsonl, run)}
            for path, means in paths.items():
                for (workload, method), entry in sorted(means.items()):
                    records.append({"world": world, "seed": seed, "path": path,
                                    "workload": workload, "method": method, **entry})  # fmt: skip
    return records
