"""The committed metrics reference is what the catalog generates, and the collector keeps to it."""

import re
from pathlib import Path

from dspark_obs.estimator.ceiling_estimator import CeilingEstimator
from dspark_obs.exporters.catalog import CATALOG
from dspark_obs.exporters.collector import Collector
from dspark_obs.exporters.reference import markdown

from dspark_obs.aggregates import Aggregates
from dspark_obs.pipeline import Pipeline
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.store.production import ProductionStore

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def test_docs_metrics_md_is_current():
    assert DOC.read_text() == markdown(), (
        "docs/metrics.md is stale: python -m dspark_obs.exporters.reference > docs/metrics.md"
    )


def test_rendered_families_are_exactly_the_catalog(tmp_path):
    store = ProductionStore(tmp_path / "store", {"format": 1, "gamma": 7})
    pipeline = Pipeline(Aggregates(7), store, estimator=CeilingEstimator(7))
    config = RuntimeConfig(mode="compact", shadow="cap-accept", concurrency=[8], steps_per_level=40)
    runtime = DSparkRuntime(config)
    for b in runtime.run():
        pipeline.ingest(b, gather=runtime.gather_target_logprobs)
    text = (
        Collector(detail=True)
        .collect(
            pipeline.aggregates.snapshot(),
            pipeline.stats.snapshot(),
            pipeline.estimator.snapshot(),
            store.snapshot(),
        )
        .decode()
    )
    typed = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.M))
    assert typed == {m.name: m.kind for m in CATALOG}
    for m in CATALOG:
        assert m.name.startswith("dspark_")
        assert (m.kind == "counter") == m.name.endswith("_total")
        for line in re.findall(rf"^{m.name}(?:_bucket|_sum|_count)?\{{([^}}]*)\}}", text, re.M):
            names = {kv.split("=")[0] for kv in line.split(",") if kv}
            assert names <= {*m.labels, "le"}, (m.name, names)
