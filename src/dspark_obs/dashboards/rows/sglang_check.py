"""Held against SGLang: our figures beside SGLang's own gauges of the same quantities.

SGLang exports `sglang:spec_accept_length`, `sglang:spec_cap_length` and
`sglang:spec_block_accept_length` from the same server (with `--enable-metrics`); each is
a mean per request-step that dspark-obs also computes from its counters. Two independent
counts of one thing: where they part by more than the alert's 10 %, one of them is wrong
(deploy/rules/recording.yml, `dspark-sglang-check`).
"""

from __future__ import annotations

from ..panels import NO_SERIES, NO_SGLANG, REL_ERROR, timeseries
from ..promql import RI

#: our series of the SGLang-served models the dashboard shows, and SGLang's own
OURS = 'engine="sglang", model_name=~"$model_name", instance=~"$instance"'
THEIRS = 'model_name=~"$model_name"'
#: why the row is empty: SGLang's own gauges, or our series of its engine, are not scraped
EMPTY = (NO_SGLANG, NO_SERIES)

#: figure: (our counter and its offset to SGLang's quantity, extra selector, SGLang's gauge)
FIGURES = {
    "accept length": ("dspark_committed_tokens", 0, "", "sglang:spec_accept_length"),
    "cap length": ("dspark_window_tokens", 1, ', mode!="static"', "sglang:spec_cap_length"),
    "block accept length": (
        "dspark_ceiling_tokens",
        1,
        ', mode="cap-accept", source="observed"',
        "sglang:spec_block_accept_length",
    ),
}


def ours(figure: str) -> str:
    counter, offset, extra, _ = FIGURES[figure]
    sel = OURS + extra

    def total(part: str) -> str:
        return f"sum by (model_name) (rate({counter}_{part}{{{sel}}}{RI}))"

    mean = f"{total('sum')} / ({total('count')} > 0)"
    return f"{offset} + {mean}" if offset else mean


def theirs(figure: str) -> str:
    """SGLang's gauge, under either name it reaches Prometheus by: prometheus_client keeps
    the colon in the text format and writes an underscore in OpenMetrics, which Prometheus 2
    asks for first."""
    name = FIGURES[figure][3].replace(":", "[:_]")
    return f'avg by (model_name) ({{__name__=~"{name}", {THEIRS}}} > 0)'


def panels() -> list:
    return [
        timeseries(
            "Ours and SGLang's, per request-step",
            "Per served model: tokens committed (SGLang's accept length), verified positions "
            "including the bonus slot (cap length; not in static mode) and, in cap-accept "
            "mode, committed plus cap-trimmed tokens (block accept length), as dspark-obs "
            "counts them and as SGLang's own gauges say (means over its last logging "
            "interval).",
            "short",
            [(ours(f), f"dspark-obs {f} {{{{model_name}}}}") for f in FIGURES]
            + [(theirs(f), f"sglang {f} {{{{model_name}}}}") for f in FIGURES],
            empty=EMPTY,
            w=14,
        ),
        timeseries(
            "Disagreement with SGLang",
            "|ours / SGLang's - 1| per model and figure. Steady traffic keeps it within a few "
            "percent; above 10 % for 15 minutes the DSparkDisagreesWithSGLang alert fires: one "
            "of the two counts is wrong.",
            "percentunit",
            [
                (f"abs(({ours(f)}) / on (model_name) ({theirs(f)}) - 1)", f"{f} {{{{model_name}}}}")
                for f in FIGURES
            ],
            empty=EMPTY,
            thresholds=REL_ERROR,
            w=10,
            min_val=0,
        ),
    ]
