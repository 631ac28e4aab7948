"""The sources row: is the exporter being fed, and what is it throwing away?

Everything above reads the step records the sources deliver; this row shows whether they
arrive, and what was rejected, dropped or folded into the overflow workload.
"""

from __future__ import annotations

from ..panels import ANY_BAD, NO_SERIES, NO_SOURCE_STATE, UP, stat_panel, timeseries
from ..promql import RI, SRC, rate_sum


def _zero_per_source() -> str:
    """0 for every source known, so that a source without errors reads 0 rather than nothing:
    serve's sources say they are up, the hook consumer's only count records."""
    return (
        f"sum by (source) (dspark_source_up{{{SRC}}}) * 0 or "
        f"sum by (source) (dspark_ingest_records_total{{{SRC}}}) * 0"
    )


def panels() -> list:
    zero_per_source = f"({_zero_per_source()})"
    empty = (NO_SERIES,)
    return [
        stat_panel(
            "Sources up",
            "1 while a source delivers step records, 0 while it fails.",
            "none",
            [(f"min by (source) (dspark_source_up{{{SRC}}})", "{{source}}")],
            empty=(NO_SOURCE_STATE, NO_SERIES),
            thresholds=UP,
            w=4,
            h=8,
            decimals=0,
        ),
        timeseries(
            "Records/s",
            "Step records accepted per second, by source.",
            "ops",
            [(rate_sum("dspark_ingest_records_total", SRC, "source"), "{{source}}")],
            empty=empty,
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
            empty=empty,
            thresholds=ANY_BAD,
            w=7,
            min_val=0,
        ),
        stat_panel(
            "Dropped steps",
            "Verify steps missing from a polled server's dumps over the dashboard's time range "
            "(gaps in forward_ct; with draining, steps recorded between a read and the clear).",
            "locale",
            [
                (
                    "sum by (source) (increase(dspark_ingest_errors_total"
                    f'{{{SRC}, reason="dropped_steps"}}[$__range])) or on (source) '
                    f"{zero_per_source}",
                    "{{source}}",
                )
            ],
            empty=empty,
            thresholds=ANY_BAD,
            w=3,
            h=8,
            decimals=0,
        ),
        stat_panel(
            "Workload overflow/s",
            'Request-steps per second counted under workload="other" because the workload '
            "cap (--workload-cap) was reached.",
            "locale",
            [(rate_sum("dspark_workload_overflow_total", SRC), "overflow")],
            empty=empty,
            thresholds=ANY_BAD,
            w=3,
            h=8,
        ),
    ]
