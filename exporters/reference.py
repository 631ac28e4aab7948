"""The metrics reference (docs/metrics.md), generated from the catalog.

`python -m dspark_obs.exporters.reference > docs/metrics.md`; a test fails when
the committed file differs from what this prints.
"""

from __future__ import annotations

import sys

from .catalog import CATALOG

INTRO = """# Metrics reference

Generated from `exporters/catalog.py` by
`python -m dspark_obs.exporters.reference > docs/metrics.md`; do not edit by hand.

Names start with `dspark_`, are in base units (`_seconds`, `_tokens`, `_ratio`),
and counters end in `_total`. Token-count histograms have integer buckets
(`le="0"`, `le="1"`, ... `le="gamma"`, `+Inf`); load histograms have buckets at
powers of two. Every series leads with the exporter's own two labels, `engine`
(`sglang`, `vllm`, or `reference` for the reference runtime) and `model_name` (the
served model, as the engines label their own metrics); one exporter has one value of
each, so they add no series. The others are only `workload` (at most `--workload-cap`
values, the rest counted as `other`; each value at most 128 characters, a longer name cut
with a hash of the whole), `mode`, `rank`, `position` (0..gamma-1), `source`,
and `reason` on ingest errors: never a request id. Gauges named "over the last N
steps" are sliding-window views (a ring of 8 blocks; N is `--window-steps`,
1024 by default); counters and histograms are cumulative, so PromQL `rate()`
gives any other window. A gauge with no data has no sample.

## Series budget

The default exposition stays at or under 250 series per (rank, workload, mode) for a node
of 8 DP ranks and 16 workloads, and what it costs grows as the table says. The families
of fine detail (marked *detail* below: the per-rank AUROC bins and the survival
histograms, which no dashboard panel, recording rule or alert reads) are written only with
`--detail-metrics` (`serve`, `hook-consumer`, `sglang-flag`). Most series a label set has
at gamma 7 (a position or a histogram without data writes nothing, so quieter groups have
fewer), measured by tests/test_series_budget.py on a real Prometheus:

| label set | default | with `--detail-metrics` |
| --- | ---: | ---: |
| per (rank, workload, mode) | 165 | 795 |
| per (workload, mode) | 420 | 658 |
| per (rank, mode) | 93 | 93 |
| per (exporter) | 2 | 2 |

So an exporter of R ranks, W workloads and M modes writes at most about
165·R·W·M + 420·W·M + 93·R·M + 2 series: 28,586 at R = 8, W = 16, M = 1, which is 223 per
(rank, workload, mode); one rank with one workload is 680. However many ranks and
workloads a source invents, at most 256 (rank, workload, mode) groups of named workloads
are kept in all (past that a rank's next workload is counted under its `other`, in
`dspark_workload_overflow_total`), so the total stays under 165·(256 + R·M) +
420·(W + 1)·M + 93·R·M + 2: 65,894 at R = 64, W = 16 and `other`, M = 1. Per-position families scale
with gamma (the 420 are 4 counters × 15 ECE bins × 7 positions); a (rank, mode) gains 6
series for each further context bucket its steps reach (13 at most); a polled source adds
its `dspark_source_up`, and each ingest error reason or drop reason one series. The
calibration bins are summed over ranks (calibration is the model's): fleet ECE, AUROC and
reliability are per workload and node, Brier per rank too. Prometheus' native histograms
would carry fine detail at less cost, but Debian's Prometheus 2.42 takes them only over the
protobuf exposition and behind `--enable-feature=native-histograms`, which a text exporter
does not write: so fine detail is an option instead.

## Exemplars

A scraper that asks for OpenMetrics (Prometheus does) gets it, and with it, on the buckets of
`dspark_window_tokens`, `dspark_accepted_tokens` and `dspark_committed_tokens`, an exemplar:
a recent request-step of that bucket, `{rid="...",step="<forward_ct>"}` with its value and
time (the request id cut to 64 characters). Prometheus keeps them with
`--enable-feature=exemplar-storage`, and Grafana shows them on a panel of the bucket, so a bad
bucket leads to `dspark-obs` commands on the stored request (a production store holds it by
node, rank and hour).

## Families

| metric | type | labels | meaning |
| --- | --- | --- | --- |
"""


def markdown() -> str:
    rows = [
        f"| `{m.name}` | {m.kind}{' (*detail*)' if m.detail else ''} | "
        f"{', '.join(f'`{x}`' for x in m.labels) or '—'} | "
        f"{m.help.format(window='N').replace('|', '/')} |"
        for m in CATALOG
    ]
    return INTRO + "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
