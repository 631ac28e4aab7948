"""The sources row: is the exporter being fed, and what is it throwing away?

Everything above reads the step records the sources deliver; this row shows whether they
arrive, and what was rejected, dropped or folded into the overflow workload.
"""

from __future__ import annotations

from ..panels import ANY_BAD, UP, stat_panel, timeseries
from ..promql import RI, SRC


def panels() -> list:
    zero_per_source = f"sum by (source) (dspark_source_up{{{SRC}}}) * 0"
    return [
        stat_panel(
            "Sources up",
            "1 while a source delivers step records, 0 while it fails.",
            "none",
            [(f"min by (source) (dspark_source_up{{{SRC}}})", "{{source}}")],
            thresholds=UP,
            w=4,
            h=8,
            decimals=0,
        ),
        timeseries(
            "Records/s",
            "Step records accepted per second, by source.",
            "ops",
            [
                (
                    f"sum by (source) (rate(dspark_ingest_records_total{{{SRC}}}{RI}))",
                    "{{source}}",
                )
            ],
            w=7,
            min_val=0,
        ),
        timeseries(
            "Ingest errors by reason",
            "Step records rejected per second, by source and reason (dropped steps are shown "
            "on their own); 0 per source while there are none.",
            "ops",
            [
                (
                    "sum by (source, reason) (rate(dspark_ingest_errors_total"
                    f'{{{SRC}, reason!="dropped_steps"}}{RI})) or on (source) {zero_per_source}',
                    "{{source}} {{reason}}",
                )
            ],
            thresholds=ANY_BAD,
            w=7,
            min_val=0,
        ),
        stat_panel(
            "Dropped steps",
            "Verify steps missing from a polled server's dumps over the dashboard's time range "
            "(gaps in forward_ct; with draining, steps recorded between a read and the clear).",
            "short",
            [
                (
                    "sum by (source) (increase(dspark_ingest_errors_total"
                    f'{{{SRC}, reason="dropped_steps"}}[$__range])) or on (source) '
                    f"{zero_per_source}",
                    "{{source}}",
                )
            ],
            thresholds=ANY_BAD,
            w=3,
            h=8,
            decimals=0,
        ),
        stat_panel(
            "Workload overflow/s",
            'Request-steps per second counted under workload="other" because the workload '
            "cap (--workload-cap) was reached.",
            "ops",
            [(f"sum(rate(dspark_workload_overflow_total{{{SRC}}}{RI}))", "overflow")],
            thresholds=ANY_BAD,
            w=3,
            h=8,
        ),
    ]
