"""The overview row: is speculation paying off right now, at a glance?

Committed throughput and the acceptance against the ceiling, reduced to a few stats and the
two curves a reader checks first; the rows below break them down.
"""

from __future__ import annotations

from ..panels import GREEN, RED, UTILISATION, YELLOW, stat_panel, threshold_steps, timeseries
from ..promql import REQ, RI, rate_mean


def panels() -> list:
    return [
        stat_panel(
            "Committed tokens/s",
            "Tokens committed per second of wall time (accepted drafts plus the bonus token, "
            "SGLang acc_len), summed over the selected workloads, modes and ranks.",
            "suffix: tok/s",
            [(f"sum(rate(dspark_committed_tokens_sum{{{REQ}}}{RI}))", "committed")],
            decimals=0,
        ),
        stat_panel(
            "Mean accepted",
            "Drafts the target accepted per request-step (correct_drafts), over the rate window.",
            "suffix: tok",
            [(rate_mean("dspark_accepted_tokens", REQ), "accepted")],
        ),
        stat_panel(
            "Mean window",
            "Drafts verified per request-step (verify_len - 1), over the rate window. Below "
            "gamma means the scheduler trimmed blocks.",
            "suffix: tok",
            [(rate_mean("dspark_window_tokens", REQ), "window")],
        ),
        stat_panel(
            "Utilisation",
            "Accepted / ceiling over request-steps whose ceiling is known (static, cap-accept, "
            "shadow twin): 1 - trim loss / ceiling over the rate window. 1 means trimming lost "
            "nothing.",
            "percentunit",
            [
                (
                    f"1 - sum(rate(dspark_trim_loss_tokens_total{{{REQ}}}{RI})) / "
                    f"sum(rate(dspark_ceiling_tokens_sum{{{REQ}}}{RI}))",
                    "utilisation",
                )
            ],
            thresholds=UTILISATION,
        ),
        stat_panel(
            "Trim loss per request-step",
            "Tokens full-block verification would have accepted beyond the window "
            "(ceiling - accepted), per request-step, on request-steps whose ceiling is known.",
            "suffix: tok",
            [
                (
                    f"sum(rate(dspark_trim_loss_tokens_total{{{REQ}}}{RI})) / "
                    f"sum(rate(dspark_ceiling_tokens_count{{{REQ}}}{RI}))",
                    "trim loss",
                )
            ],
            thresholds=threshold_steps((None, GREEN), (0.1, YELLOW), (0.5, RED)),
            decimals=3,
        ),
        stat_panel(
            "Trimmed drafts per request-step",
            "Drafted tokens left unverified by trimming (gamma - window) per request-step.",
            "suffix: tok",
            [
                (
                    f"sum(rate(dspark_trimmed_draft_tokens_total{{{REQ}}}{RI})) / "
                    f"sum(rate(dspark_request_steps_total{{{REQ}}}{RI}))",
                    "trimmed",
                )
            ],
        ),
        timeseries(
            "Accepted, window and ceiling",
            "Mean drafts per request-step: window (verified), accepted, the ceiling full-block "
            "verification would accept (histogram by source: observed from static/cap-accept "
            "rows, shadow from a cap-accept twin; and the sliding gauge "
            "dspark_ceiling_mean_tokens), and the estimated ceiling (source=walk: observed plus "
            "tail walks; source=population: survival curve). Gauges are averaged unweighted "
            "over the selected series.",
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
            w=16,
            min_val=0,
        ),
        timeseries(
            "Utilisation (last N steps)",
            "dspark_utilisation_ratio: accepted / ceiling over the last N steps per workload, "
            "mode and rank; 1 means trimming lost nothing.",
            "percentunit",
            [
                (
                    f"dspark_utilisation_ratio{{{REQ}}}",
                    "{{workload}} {{mode}} r{{rank}} @{{instance}}",
                )
            ],
            thresholds=UTILISATION,
            w=8,
            max_val=1,
        ),
    ]
