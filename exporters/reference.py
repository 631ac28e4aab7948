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
values, the rest counted as `other`), `mode`, `rank`, `position` (0..gamma-1), `source`,
and `reason` on ingest errors: never a request id. Gauges named "over the last N
steps" are sliding-window views (a ring of 8 blocks; N is `--window-steps`,
1024 by default); counters and histograms are cumulative, so PromQL `rate()`
gives any other window. A gauge with no data has no sample.

| metric | type | labels | meaning |
| --- | --- | --- | --- |
"""


def markdown() -> str:
    rows = [
        f"| `{m.name}` | {m.kind} | {', '.join(f'`{x}`' for x in m.labels) or '—'} | "
        f"{m.help.format(window='N').replace('|', '/')} |"
        for m in CATALOG
    ]
    return INTRO + "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
