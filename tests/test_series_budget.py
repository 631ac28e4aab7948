"""The default exposition within its series budget, counted by a real Prometheus.

A node of 8 DP ranks serving 16 workloads in one mode, as docs/metrics.md sizes a fleet:
the reference runtime's steps (a compact run with a cap-accept shadow, so every family
has data), each replayed on every rank with its requests renamed per rank and spread over
16 workload names, into one pipeline, served over HTTP, scraped by Prometheus. What it
ingests stays within 250 series per (rank, workload, mode), and the series per label set
are the ones docs/metrics.md states; the families of fine detail, with `detail`, add what
docs/metrics.md says they add. promtool lints the exposition clean.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from dspark_obs.exporters.collector import Collector
from dspark_obs.exporters.endpoint import Exporter

from dspark_obs.pipeline import build_pipeline
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from tests.prometheus_harness import PrometheusServer, promtool_check_metrics, require_prometheus

require_prometheus()

RANKS, WORKLOADS = 8, 16
BUDGET = 250
DOCS = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def node(ranks: int, workloads: int):
    """A pipeline fed one runtime run's steps on every rank, over `workloads` names."""
    config = RuntimeConfig(
        mode="compact", shadow="cap-accept", concurrency=[24], steps_per_level=40, seed=3
    )
    runtime = DSparkRuntime(config)
    pipeline = build_pipeline(config.gamma)
    names = np.array([f"wl-{i:02d}" for i in range(workloads)], dtype=object)
    for batch in runtime.run():
        spread = np.array([zlib.crc32(str(r).encode()) % workloads for r in batch.rid])
        for rank in range(ranks):
            copy = dataclasses.replace(
                batch,
                rank=rank,
                rid=np.array([f"r{rank}-{r}" for r in batch.rid], dtype=object),
                workload=names[spread],
                workload_codes=None,
                workload_names=None,
            )
            pipeline.ingest(copy, gather=runtime.gather_target_logprobs)
    pipeline.estimator.close()
    return pipeline


def render(pipeline, *, detail: bool = False) -> str:
    est = pipeline.estimator
    return (
        Collector(detail=detail)
        .collect(pipeline.aggregates.snapshot(), pipeline.stats.snapshot(), est.snapshot())
        .decode()
    )


#: the label sets a series counts under, by the labels it carries beyond `mode`
UNITS = {("rank", "workload"): "rank, workload, mode", ("workload",): "workload, mode",
         ("rank",): "rank, mode", (): "exporter"}  # fmt: skip


def per_label_set(text: str) -> dict[str, int]:
    """The most series any one (rank, workload, mode), (workload, mode), (rank, mode) or the
    exporter itself has: a position or a histogram without data writes nothing, so groups
    of few request-steps have fewer."""
    counts: dict[str, Counter] = {unit: Counter() for unit in UNITS.values()}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.rsplit(" ", 1)[0]))
            carried = tuple(k for k in ("rank", "workload") if k in labels)
            key = tuple(labels.get(k) for k in ("rank", "workload", "mode"))
            counts[UNITS[carried]][key] += 1
    return {unit: max(c.values(), default=0) for unit, c in counts.items()}


def documented() -> dict[str, int]:
    """docs/metrics.md's series per label set, at gamma 7, from its budget table."""
    rows = re.findall(r"^\| per \(([^)]*)\) \| (\d+) \| (\d+) \|$", DOCS.read_text(), re.M)
    assert rows, "docs/metrics.md has no series-budget table"
    return {k: (int(default), int(detail)) for k, default, detail in rows}


@pytest.fixture(scope="module")
def fleet_node():
    return node(RANKS, WORKLOADS)


def test_series_per_label_set_are_the_documented_ones(fleet_node):
    counts = per_label_set(render(fleet_node))
    detail = per_label_set(render(fleet_node, detail=True))
    assert {unit: (counts[unit], detail[unit]) for unit in UNITS.values()} == documented()


def test_a_node_of_8_ranks_and_16_workloads_is_within_the_budget(fleet_node, tmp_path):
    text = render(fleet_node)
    lint = promtool_check_metrics(text)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    exporter = Exporter(fleet_node, "127.0.0.1", 0, identity=("reference", "budget-model"))
    url = exporter.start()
    target = url.removeprefix("http://").split("/")[0]
    prom = PrometheusServer({"node": [target]}, scrape_interval="1s", workdir=tmp_path / "p")
    try:
        prom.start()
        prom.wait_until_up("node")
        series = prom.wait_for(
            'count({__name__=~"dspark_.+", job="node"})', lambda r: bool(r), timeout=120
        )
        total = int(float(series[0]["value"][1]))
    finally:
        prom.stop()
        exporter.stop()
    assert total == sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    per_group = total / (RANKS * WORKLOADS)
    assert per_group <= BUDGET, per_group
