"""P4: one scrape (snapshot + text rendering) for 16 workloads x 8 positions x 4 ranks."""

from __future__ import annotations

import numpy as np
from dspark_obs.exporters.render import Renderer

from dspark_obs.aggregates import Aggregates
from dspark_obs.pipeline import IngestStats

from .aggregate_update import batches
from .common import record, repeat

TARGET_MS = 10.0
WORKLOADS = tuple(f"workload-{i:02d}" for i in range(16))


def populated(steps: int) -> Aggregates:
    agg = Aggregates(8)
    for rank in range(4):
        for i, b in enumerate(batches(64, steps, gamma=8)):
            b.rank = rank
            b.workload_names = WORKLOADS
            b.workload_codes = (np.arange(b.num_reqs) + i) % len(WORKLOADS)
            b.workload = np.array(WORKLOADS, dtype=object)[b.workload_codes]
            agg.update(b)
    agg.flush()
    return agg


def run(quick: bool) -> list[dict]:
    agg = populated(50 if quick else 200)
    renderer = Renderer()
    stats = IngestStats()
    stats.record("runtime", 800)
    text = renderer.render(agg.snapshot(), stats)
    times = repeat(lambda: renderer.render(agg.snapshot(), stats), 5 if quick else 20)
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    return [
        record(
            "P4_scrape_render",
            {"workloads": 16, "positions": 8, "ranks": 4},
            "ms_per_scrape",
            times,
            1e3,
            target=TARGET_MS,
            samples=series,
            bytes=len(text),
        )
    ]
