"""The cost-of-trimming row: does compact verification pay on this traffic, against static?

Net tokens/s of the run's policy against verifying every draft, per workload, with its
interval, and the two parts it is made of (docs/whatif.md, "Live"). Every line is a ratio
of sums of the exporter's counters over the selected series, so it holds for any set of
ranks and instances the variables pick.
"""

from __future__ import annotations

from ..panels import GREEN, NO_PRICED_STEPS, NO_SERIES, RED, threshold_steps, timeseries
from ..promql import REQ, RI, ratio


def _rate(metric: str) -> str:
    return f"sum by (workload) (rate({metric}{{{REQ}}}{RI}))"


def _tokens_per_s(tokens: str, seconds: str) -> str:
    return ratio(_rate(tokens), _rate(seconds))


_OWN = _tokens_per_s("dspark_trim_committed_tokens_total", "dspark_trim_step_seconds_total")


def _static(tokens: str) -> str:
    return _tokens_per_s(tokens, "dspark_trim_static_step_seconds_total")


def panels() -> list:
    static = "dspark_trim_static_committed_tokens_total"
    empty = (NO_PRICED_STEPS, NO_SERIES)
    return [
        timeseries(
            "Net tokens/s of trimming vs static",
            "Tokens/s of the run's verify policy minus what static (every draft verified) "
            "would give on the same request-steps, per workload: C_o/T_o - C_s/T_s over the "
            "rate window. Positive: trimming pays. The band is the ceiling estimator's "
            "bracket on what static would have accepted where the run trimmed.",
            "suffix: tok/s",
            [
                (f"{_OWN} - {_static(static)}", "net {{workload}}"),
                (
                    f"{_OWN} - {_static('dspark_trim_static_committed_upper_tokens_total')}",
                    "lower {{workload}}",
                ),
                (
                    f"{_OWN} - {_static('dspark_trim_static_committed_lower_tokens_total')}",
                    "upper {{workload}}",
                ),
            ],
            empty=empty,
            thresholds=threshold_steps((None, RED), (0, GREEN)),
            w=12,
        ),
        timeseries(
            "Step time saved vs accepted tokens lost",
            "The net's two parts per workload: the run's tokens at its cheaper steps "
            "(C_o/T_o - C_o/T_s, >= 0) and the tokens trimming gave up at static's step time "
            "((C_o - C_s)/T_s, <= 0). They sum to the net.",
            "suffix: tok/s",
            [
                (
                    f"{_OWN} - {_static('dspark_trim_committed_tokens_total')}",
                    "saved {{workload}}",
                ),
                (
                    ratio(
                        f"{_rate('dspark_trim_committed_tokens_total')} - {_rate(static)}",
                        _rate("dspark_trim_static_step_seconds_total"),
                    ),
                    "lost {{workload}}",
                ),
            ],
            empty=empty,
            w=12,
        ),
    ]
