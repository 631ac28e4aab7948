"""The collector writes published snapshots through the catalog alone.

A family is a catalog entry naming a section attribute; the collector needs no
change to publish one more (`test_a_metric_of_existing_data_is_one_catalog_entry`).
The exporter imports nothing of the producers, and every part a producer
publishes has the labels and type its catalog entry declares.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from dspark_obs.estimator.ceiling_estimator import CeilingEstimator
from dspark_obs.exporters.catalog import CATALOG, REQ, Metric
from dspark_obs.exporters.collector import Collector, bound_string

from dspark_obs.aggregates import Aggregates
from dspark_obs.pipeline import Pipeline
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.series import Buckets, Labels, Samples, ratio
from dspark_obs.sources.stats import IngestStats
from dspark_obs.store.production import ProductionStore

EXPORTERS = Path(__file__).resolve().parents[1] / "exporters"


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Pipeline:
    """Every producer there is, a production store's among them."""
    stats = IngestStats()
    store = ProductionStore(tmp_path_factory.mktemp("c") / "store", {"format": 1, "gamma": 7})
    pipeline = Pipeline(Aggregates(7), store, stats=stats, estimator=CeilingEstimator(7))
    config = RuntimeConfig(mode="compact", shadow="cap-accept", concurrency=[8], steps_per_level=40)
    runtime = DSparkRuntime(config)
    for b in runtime.run():
        pipeline.ingest(b, gather=runtime.gather_target_logprobs)
    stats.error("feed", "bad_record", "a test record")
    stats.set_up("feed", False)
    return pipeline


def snapshots(pipeline: Pipeline) -> tuple:
    return (
        pipeline.aggregates.snapshot(),
        pipeline.stats.snapshot(),
        pipeline.estimator.snapshot(),
        None if pipeline.writer is None else pipeline.writer.snapshot(),
    )


def family(text: str, name: str) -> list[str]:
    """The lines of one family, header included."""
    return [
        line
        for line in text.splitlines()
        if re.match(rf"(# (HELP|TYPE) )?{name}(_bucket|_sum|_count)?[ {{]", line)
    ]


def series(text: str, name: str) -> dict[str, float]:
    """The samples of one series name by label string."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line[len(name) :].rsplit(" ", 1)
            out[labels] = float(value)
    return out


def test_a_metric_of_existing_data_is_one_catalog_entry(pipeline):
    """One more family of data a section already has: an entry, and no collector change."""
    extra = Metric(
        "dspark_request_steps_seen",
        "gauge",
        REQ,
        "Request-steps seen, as a gauge ({window}-step window, unused here).",
        source=("tokens", "request_steps"),
    )
    snaps = snapshots(pipeline)
    base = Collector().collect(*snaps).decode()
    text = Collector((*CATALOG, extra)).collect(*snaps).decode()
    added = family(text, "dspark_request_steps_seen")
    assert added[:2] == [
        "# HELP dspark_request_steps_seen Request-steps seen, as a gauge "
        "(1024-step window, unused here).",
        "# TYPE dspark_request_steps_seen gauge",
    ]
    counters = family(base, "dspark_request_steps_total")[2:]
    assert len(counters) > 1
    assert added[2:] == [
        line.replace("dspark_request_steps_total", "dspark_request_steps_seen") for line in counters
    ]
    assert text == base + "\n".join(added) + "\n"  # the rest unchanged, the new family last


def test_a_new_quantity_is_one_attribute(pipeline):
    """A quantity a section does not have yet: one attribute of the section, and an entry."""
    aggregates, ingest, estimate, _ = snapshots(pipeline)
    tokens = aggregates.sections()["tokens"]

    class Tokens(type(tokens)):
        committed_mean = property(
            lambda s: Samples(
                s.labels.request, ratio(s.committed_tokens.sums, s.request_steps.values)
            )
        )

    class Snapshot:
        def sections(self):
            fields = (getattr(tokens, f.name) for f in dataclasses.fields(tokens))
            return {**aggregates.sections(), "tokens": Tokens(*fields)}

    extra = Metric(
        "dspark_committed_mean_tokens",
        "gauge",
        REQ,
        "Mean tokens committed per request-step since start.",
        source=("tokens", "committed_mean"),
    )
    text = Collector((*CATALOG, extra)).collect(Snapshot(), ingest, estimate).decode()
    assert family(text, "dspark_committed_mean_tokens")[1] == (
        "# TYPE dspark_committed_mean_tokens gauge"
    )
    sums, counts, means = (
        series(text, name)
        for name in (
            "dspark_committed_tokens_sum",
            "dspark_committed_tokens_count",
            "dspark_committed_mean_tokens",
        )
    )
    assert means.keys() == sums.keys() and len(means) > 1
    for labels, mean in means.items():
        assert mean == pytest.approx(sums[labels] / counts[labels], rel=1e-12)


def test_the_exporter_imports_nothing_of_the_producers():
    producers = ("aggregates", "estimator", "sources", "telemetry", "calibration")
    for path in EXPORTERS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                named = module.lstrip(".").split(".")
                assert not (node.level and named[0] in producers), (path.name, module)
                assert not any(f"dspark_obs.{p}" in module for p in producers), (path.name, module)


def test_every_part_has_the_labels_and_type_of_its_entry(pipeline):
    sections = {}
    for snap in snapshots(pipeline):
        sections.update(snap.sections())
    for m in CATALOG:
        section, attr = m.source
        assert sections[section] is not None, m.name
        parts = getattr(sections[section], attr)
        for part in parts if isinstance(parts, tuple) else (parts,):
            assert isinstance(part, Buckets if m.kind == "histogram" else Samples), m.name
            assert part.labels.names == m.labels, m.name
            values = part.counts if isinstance(part, Buckets) else part.values
            assert len(values) == len(part.labels), m.name


def test_catalog_order_is_the_written_order(pipeline):
    text = Collector(detail=True).collect(*snapshots(pipeline)).decode()
    written = re.findall(r"^# TYPE (\S+) ", text, flags=re.M)
    assert written == [m.name for m in CATALOG]


def test_fine_detail_is_written_only_when_asked_for(pipeline):
    """The default exposition leaves out the families of fine detail, and only those."""
    text = Collector().collect(*snapshots(pipeline)).decode()
    written = re.findall(r"^# TYPE (\S+) ", text, flags=re.M)
    detail = {m.name for m in CATALOG if m.detail}
    assert written == [m.name for m in CATALOG if not m.detail]
    assert detail == {
        "dspark_confidence_survival", "dspark_confidence_accepted_survival",
        "dspark_confidence_auroc_positives_total", "dspark_confidence_auroc_negatives_total",
        "dspark_confidence_auroc_negatives_below_total",
    }  # fmt: skip


class Demo:
    """A producer the collector has never heard of."""

    def __init__(self, section):
        self.section = section

    def sections(self):
        return {"demo": self.section}


DEMO = (
    Metric("demo_up", "gauge", ("source",), "Up.", source=("demo", "up")),
    Metric("demo_size", "histogram", ("source",), "Sizes {window}.", source=("demo", "size")),
    Metric("demo_total", "counter", (), "Total.", source=("other", "total")),
)


def test_section_rules_nan_keep_and_formatting():
    labels = Labels(("source",), [('a"b\\c\nd',), ("e",), ("f",)])
    section = SimpleNamespace(
        window_steps=64,
        up=(
            Samples(labels, np.array([1.0, np.nan, 0.5])),
            Samples(Labels(("source",), []), np.zeros(0)),
        ),
        size=Buckets(
            labels,
            (1 / 3, 1, 2.5),
            np.array([[1, 0, 0, 2], [0, 0, 0, 0], [0, 3, 1, 0]]),
            np.array([7.0, 0.0, 4.25]),
            keep=np.array([True, False, True]),
        ),
    )
    text = Collector(DEMO).collect(Demo(section), None).decode()
    assert text == (
        "# HELP demo_up Up.\n# TYPE demo_up gauge\n"
        'demo_up{source="a\\"b\\\\c\\nd"} 1.0\n'
        'demo_up{source="f"} 0.5\n'
        "# HELP demo_size Sizes 64.\n# TYPE demo_size histogram\n"
        'demo_size_bucket{source="a\\"b\\\\c\\nd",le="0.333333"} 1\n'
        'demo_size_bucket{source="a\\"b\\\\c\\nd",le="1"} 1\n'
        'demo_size_bucket{source="a\\"b\\\\c\\nd",le="2.5"} 1\n'
        'demo_size_bucket{source="a\\"b\\\\c\\nd",le="+Inf"} 3\n'
        'demo_size_sum{source="a\\"b\\\\c\\nd"} 7.0\n'
        'demo_size_count{source="a\\"b\\\\c\\nd"} 3\n'
        'demo_size_bucket{source="f",le="0.333333"} 0\n'
        'demo_size_bucket{source="f",le="1"} 3\n'
        'demo_size_bucket{source="f",le="2.5"} 4\n'
        'demo_size_bucket{source="f",le="+Inf"} 4\n'
        'demo_size_sum{source="f"} 4.25\n'
        'demo_size_count{source="f"} 4\n'
    )
    # a present section writes its headers even without series; an absent one writes nothing
    empty = SimpleNamespace(
        window_steps=64,
        up=Samples(labels, np.full(3, np.nan)),
        size=replace(section.size, keep=np.zeros(3, dtype=bool)),
    )
    assert Collector(DEMO).collect(Demo(empty)).decode() == (
        "# HELP demo_up Up.\n# TYPE demo_up gauge\n"
        "# HELP demo_size Sizes 64.\n# TYPE demo_size histogram\n"
    )
    assert Collector(DEMO).collect(Demo(None)) == b""
    total = SimpleNamespace(total=Samples(Labels((), [()]), np.array([3])))

    class Other:
        def sections(self):
            return {"other": total}

    assert Collector(DEMO).collect(Other()).decode() == (
        "# HELP demo_total Total.\n# TYPE demo_total counter\ndemo_total 3\n"
    )


def test_bound_strings():
    assert [bound_string(b) for b in (0, 7, np.int64(8192), 1 / 15, 0.5, 14 / 15)] == [
        "0",
        "7",
        "8192",
        "0.0666667",
        "0.5",
        "0.933333",
    ]


def test_label_strings_are_built_once_per_label_set(pipeline):
    collector = Collector()
    snaps = snapshots(pipeline)
    first = collector.collect(*snaps)
    cached = dict(collector._labels)
    assert collector.collect(*snapshots(pipeline)) == first
    assert collector._labels.keys() == cached.keys()
    assert all(collector._labels[k] is v for k, v in cached.items())


def test_a_pipeline_that_has_seen_nothing_publishes_its_headers():
    """Before the first step (a source still down), a scrape must answer, not fail: the
    ingest families, and no sample of any per-workload series."""
    empty = Pipeline(Aggregates(7), stats=IngestStats(), estimator=CeilingEstimator(7))
    text = Collector().collect(*snapshots(empty)).decode()
    assert "# TYPE dspark_ingest_records_total counter" in text
    assert not series(text, "dspark_confidence_auroc_positives_total")
    assert not series(text, "dspark_request_steps_total")
