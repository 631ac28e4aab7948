"""Exemplars: a histogram bucket's recent request-step, as Prometheus stores it.

`serve` on the reference runtime, scraped by a real Prometheus with exemplar storage on
(`--enable-feature=exemplar-storage`): it asks for OpenMetrics and gets it, and its
exemplars API gives, for the window, accepted and committed histograms' buckets, a request
id and step that the run directory holds with exactly that value. A scraper that does not
ask for OpenMetrics gets the text format without exemplars.
"""

from __future__ import annotations

import re
import time
import urllib.request

import polars as pl

from bench.serve_child import serve_args
from dspark_obs.store import open_run
from tests.prometheus_harness import PrometheusServer, require_prometheus
from tests.serving import wait_until
from tests.test_serve_cli import OPENER, Child

require_prometheus()

OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


def test_buckets_carry_a_recent_request_step_that_prometheus_stores(tmp_path):
    # at the runtime's own pace: the test waits on Prometheus' scrapes (tests/live_exporter.py)
    child = Child(*serve_args("runtime"), "--sts", "none", "--concurrency", "16",
                  "--out", str(tmp_path / "run"), workdir=tmp_path / "cwd")  # fmt: skip
    prom = None
    try:
        url = child.url()
        request = urllib.request.Request(url, headers={"Accept": OPENMETRICS})

        def family() -> str | None:
            """The OpenMetrics exposition once a request step is counted (none before)."""
            with OPENER.open(request, timeout=10) as r:
                assert r.headers["Content-Type"].startswith("application/openmetrics-text")
                text = r.read().decode()
            assert text.endswith("# EOF\n")
            # the family, without _total
            return text if "# TYPE dspark_request_steps counter" in text else None

        wait_until(family, "a request step counted", child)
        with OPENER.open(url, timeout=10) as r:  # the text format: no exemplar, no EOF
            plain = r.read().decode()
        assert " # {" not in plain and "# EOF" not in plain
        target = re.sub(r"^https?://", "", url).split("/")[0]
        prom = PrometheusServer({"dspark": [target]}, scrape_interval="1s",
                                workdir=tmp_path / "prom",
                                extra_args=["--enable-feature=exemplar-storage"])  # fmt: skip
        prom.start()
        prom.wait_until_up("dspark")
        found = wait_until(
            lambda: prom.exemplars(
                "dspark_accepted_tokens_bucket", time.time() - 600, time.time() + 60
            ),
            "an exemplar stored by Prometheus",
            interval=0.2,
        )
    finally:
        if prom is not None:
            prom.stop()
        child.stop()
    requests = open_run(tmp_path / "run").requests().collect()
    checked = 0
    for series in found:
        for ex in series["exemplars"]:
            rid, step = ex["labels"]["rid"], int(ex["labels"]["step"])
            row = requests.filter((pl.col("rid") == rid) & (pl.col("forward_ct") == step))
            assert row.height == 1, (rid, step)
            assert float(ex["value"]) == row["correct_drafts"][0]  # the accepted drafts
            le = series["seriesLabels"]["le"]
            assert le == "+Inf" or float(ex["value"]) <= float(le)
            checked += 1
    assert checked > 0
