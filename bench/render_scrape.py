"""P4: one scrape (snapshots + collecting them as text) for 16 workloads x 8 positions x 4 ranks.

The baseline renders the same families and series with `prometheus_client`, the
library SGLang uses for its own metrics: the registry is built once, untimed,
from our exposition (labelled gauges, counters and histograms set to our
values; `baselines.prometheus_client_registry`), checked to hold exactly our
samples, and a scrape is `generate_latest`. Ours includes taking the snapshot,
the baseline only renders, so the ratio is conservative.
"""

from __future__ import annotations

import numpy as np
import prometheus_client
from dspark_obs.exporters.collector import Collector

from dspark_obs.aggregates import Aggregates
from dspark_obs.sources.stats import IngestStats

from .aggregate_update import batches
from .baselines import prometheus_client_registry, same_samples
from .common import record, repeat_pair, with_baseline

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
    collector = Collector()
    stats = IngestStats()
    stats.record("runtime", 800)
    text = collector.collect(agg.snapshot(), stats.snapshot())
    series = sum(1 for line in text.splitlines() if line and not line.startswith(b"#"))
    registry = prometheus_client_registry(text)
    base_text = prometheus_client.generate_latest(registry)
    checked = same_samples(text, base_text)
    n = 2 if quick else 20
    times, base_times = repeat_pair(
        lambda: collector.collect(agg.snapshot(), stats.snapshot()),
        lambda: prometheus_client.generate_latest(registry),
        n,
        n,
    )
    rec = record(
        "P4_scrape_render",
        {"workloads": 16, "positions": 8, "ranks": 4},
        "ms_per_scrape",
        times,
        1e3,
        target=TARGET_MS,
        samples=series,
        bytes=len(text),
    )
    return [
        with_baseline(
            rec,
            base_times,
            1e3,
            baseline="prometheus_client generate_latest over a registry of the same "
            "families and series (labelled Gauge/Counter/Histogram children)",
            baseline_check={"samples_equal": checked, "baseline_bytes": len(base_text)},
        )
    ]
