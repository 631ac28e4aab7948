"""The overview row: is speculation paying off right now, at a glance?

Committed throughput and the acceptance against the ceiling, reduced to a few stats and the
two curves a reader checks first; the rows below break them down. Utilisation and trim loss
need the ceiling, which `serve` as first started (compact, no shadow twin) never observes:
there they show the ceiling walk's estimate, named as such (`promql.known_or_estimated`).
"""

from __future__ import annotations

from ..panels import (
    GREEN,
    NO_SERIES,
    RED,
    UTILISATION,
    YELLOW,
    stat_panel,
    threshold_steps,
    timeseries,
    utilisation_timeseries,
)
from ..promql import (
    CEILING_LEGEND,
    CEILING_SOURCE,
    REQ,
    rate_mean,
    rate_sum,
    ratio,
    trim_loss,
    utilisation,
    utilisation_last_n,
)


def panels() -> list:
    empty = (NO_SERIES,)
    return [
        stat_panel(
            "Committed tokens/s",
            "Tokens committed per second of wall time (accepted drafts plus the bonus token, "
            "SGLang acc_len), summed over the selected workloads, modes and ranks.",
            "locale",
            [(rate_sum("dspark_committed_tokens_sum", REQ), "committed")],
            empty=empty,
            decimals=0,
        ),
        stat_panel(
            "Mean accepted",
            "Drafts the target accepted per request-step (correct_drafts), over the rate window.",
            "suffix: tok",
            [(rate_mean("dspark_accepted_tokens", REQ), "accepted")],
            empty=empty,
        ),
        stat_panel(
            "Mean window",
            "Drafts verified per request-step (verify_len - 1), over the rate window. Below "
            "gamma means the scheduler trimmed blocks.",
            "suffix: tok",
            [(rate_mean("dspark_window_tokens", REQ), "window")],
            empty=empty,
        ),
        stat_panel(
            "Utilisation",
            "Accepted / ceiling over the rate window: 1 - trim loss / ceiling over request-steps "
            "whose ceiling is known, else mean accepted / the estimated mean ceiling. 1 means "
            "trimming lost nothing. " + CEILING_SOURCE,
            "percentunit",
            [(utilisation(REQ), CEILING_LEGEND)],
            empty=empty,
            thresholds=UTILISATION,
            named=True,
        ),
        stat_panel(
            "Trim loss per request-step",
            "Tokens full-block verification would have accepted beyond the window "
            "(ceiling - accepted), per request-step, over the rate window: the trim loss "
            "counter over request-steps whose ceiling is known, else the estimated mean "
            "ceiling less the mean accepted. " + CEILING_SOURCE,
            "suffix: tok",
            [(trim_loss(REQ), CEILING_LEGEND)],
            empty=empty,
            thresholds=threshold_steps((None, GREEN), (0.1, YELLOW), (0.5, RED)),
            decimals=3,
            named=True,
        ),
        stat_panel(
            "Trimmed drafts per request-step",
            "Drafted tokens left unverified by trimming (gamma - window) per request-step.",
            "suffix: tok",
            [
                (
                    ratio(
                        rate_sum("dspark_trimmed_draft_tokens_total", REQ),
                        rate_sum("dspark_request_steps_total", REQ),
                    ),
                    "trimmed",
                )
            ],
            empty=empty,
        ),
        timeseries(
            "Accepted, window and ceiling",
            "Mean drafts per request-step: window (verified), accepted, the ceiling full-block "
            "verification would accept (histogram by source: observed from static/cap-accept "
            "rows, shadow from a cap-accept twin; and the sliding gauge "
            "dspark_ceiling_mean_tokens; neither in compact without a shadow), and the "
            "estimated ceiling (source=walk: observed plus tail walks; source=population: "
            "survival curve). Gauges are averaged unweighted over the selected series.",
            "suffix: tok",
            [
                (rate_mean("dspark_window_tokens", REQ), "window"),
                (rate_mean("dspark_accepted_tokens", REQ), "accepted"),
                (rate_mean("dspark_ceiling_tokens", REQ, "source"), "ceiling ({{source}})"),
                (f"avg(dspark_ceiling_mean_tokens{{{REQ}}})", "ceiling (last N steps)"),
                (
                    f"avg by (source) (dspark_ceiling_estimate_tokens{{{REQ}}})",
                    "estimated ceiling ({{source}})",
                ),
            ],
            empty=empty,
            w=16,
            min_val=0,
        ),
        utilisation_timeseries(
            "Utilisation (last N steps)",
            "Accepted / ceiling over the last N steps per workload, mode and rank: "
            "dspark_utilisation_ratio where the ceiling is known, else dspark_accepted_mean_tokens"
            ' / dspark_ceiling_estimate_tokens{source="walk"}; 1 means trimming lost nothing. '
            + CEILING_SOURCE,
            [
                (
                    utilisation_last_n(REQ),
                    "{{workload}} {{mode}} r{{rank}} @{{instance}}, " + CEILING_LEGEND,
                )
            ],
            empty=empty,
            w=8,
        ),
    ]
