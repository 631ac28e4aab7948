"""Held against vLLM: our counts beside vLLM's own spec-decode counters of the same things.

vLLM counts a draft per request-step that verified drafts
(`vllm:spec_decode_num_drafts_total`) and the drafts it accepted
(`vllm:spec_decode_num_accepted_tokens_total`); the vLLM hook counts the same request-steps
and their committed tokens (accepted plus the bonus). Two independent counts of one thing:
where they part by more than the alert's 10 %, one of them is wrong, most often ours
missing steps a rank dropped (deploy/rules/recording.yml, `dspark-vllm-check`).
"""

from __future__ import annotations

from ..panels import NO_SERIES, REL_ERROR, timeseries
from ..promql import RI

#: our series of the vLLM-served models the dashboard shows, and vLLM's own (whose
#: `engine` label is its engine index, not ours)
OURS = 'engine="vllm", model_name=~"$model_name", instance=~"$instance"'
THEIRS = 'model_name=~"$model_name"'
NO_VLLM = "vLLM's own /metrics is not scraped beside series of engine vllm"
EMPTY = (NO_VLLM, NO_SERIES)


def _theirs(counter: str) -> str:
    """A counter of vLLM's per second, summed per model, under either name it reaches
    Prometheus by (the colon in the text format, an underscore in OpenMetrics)."""
    name = f"vllm[:_]spec_decode_{counter}_total"
    return f'sum by (model_name) (rate({{__name__=~"{name}", {THEIRS}}}{RI}))'


def _ours(family: str) -> str:
    return f"sum by (model_name) (rate({family}{{{OURS}}}{RI}))"


#: figure: (ours, vLLM's)
FIGURES = {
    "request-steps/s": (_ours("dspark_request_steps_total"), _theirs("num_drafts")),
    "accepted per request-step": (
        f"{_ours('dspark_committed_tokens_sum')} / ({_ours('dspark_committed_tokens_count')} > 0)"
        " - 1",
        f"{_theirs('num_accepted_tokens')} / ({_theirs('num_drafts')} > 0)",
    ),
}


def panels() -> list:
    return [
        timeseries(
            "Ours and vLLM's",
            "Per served model: request-steps that verified drafts per second, and drafts "
            "accepted per such request-step, as dspark-obs's vLLM hook counts them and as "
            "vLLM's own spec-decode counters do.",
            "short",
            [(ours, f"dspark-obs {f} {{{{model_name}}}}") for f, (ours, _) in FIGURES.items()]
            + [(theirs, f"vllm {f} {{{{model_name}}}}") for f, (_, theirs) in FIGURES.items()],
            empty=EMPTY,
            w=14,
        ),
        timeseries(
            "Disagreement with vLLM",
            "|ours / vLLM's - 1| per model and figure. Above 10 % for 15 minutes the "
            "DSparkDisagreesWithVLLM alert fires: one of the two counts is wrong (fewer "
            "request-steps of ours: a rank drops steps or is not hooked).",
            "percentunit",
            [
                (f"abs(({ours}) / on (model_name) ({theirs}) - 1)", f"{f} {{{{model_name}}}}")
                for f, (ours, theirs) in FIGURES.items()
            ],
            empty=EMPTY,
            thresholds=REL_ERROR,
            w=10,
            min_val=0,
        ),
    ]
