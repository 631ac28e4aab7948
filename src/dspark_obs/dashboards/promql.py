"""PromQL pieces every row's queries are made of: label selectors, histogram means, and the
ceiling a figure rests on.

Every selector filters on the template variables by regex (`.*` is "All"), per label set
of the exporter's catalog, so a query written once runs in Grafana and, with the variables
replaced, straight against Prometheus.

A ratio divides by its denominator only where that is above zero: an idle window then has no
sample, so the panel shows its `noValue` text (which says why it can be empty) rather than
NaN.

The ceiling (what full-block verification would accept) is known only on static and
cap-accept rows and on a `--shadow cap-accept` twin's; `dspark-obs serve` as first started
(compact, no shadow) knows none. A figure of the ceiling therefore falls back to the ceiling
walk's estimate (the counters behind `dspark_ceiling_estimate_tokens{source="walk"}`), and
carries a `ceiling` label saying which of the two it is, for the legend to show.
"""

from __future__ import annotations

# label selectors per label set of the catalog; every series carries the exporter's engine and
# model (catalog.IDENTITY)
IDENTITY = 'engine=~"$engine", model_name=~"$model_name"'
REQ = f'{IDENTITY}, instance=~"$instance", workload=~"$workload", mode=~"$mode", rank=~"$rank"'
STEP = f'{IDENTITY}, instance=~"$instance", mode=~"$mode", rank=~"$rank"'
REL = f'{IDENTITY}, instance=~"$instance", workload=~"$workload", mode=~"$mode"'
SRC = f'{IDENTITY}, instance=~"$instance"'
RI = "[$__rate_interval]"

#: the label that says which ceiling a figure rests on, and its two values
CEILING = "ceiling"
KNOWN = "known ceiling"
ESTIMATED = "estimated (walk)"
#: its place in a legend
CEILING_LEGEND = "{{" + CEILING + "}}"

#: where the ceiling comes from, for every figure of it
CEILING_SOURCE = (
    "The ceiling is known on static and cap-accept rows and from a cap-accept shadow twin "
    "(serve --shadow cap-accept); where none is known (compact without a shadow) the panel "
    f'shows the ceiling walk\'s estimate instead, named "{ESTIMATED}": observed ceilings and '
    "the ended walks' point estimates over their request-steps (dspark_ceiling_estimate_tokens"
    '{source="walk"}).'
)


def ratio(num: str, den: str) -> str:
    """`num / den` with no sample where `den` is 0: an idle window's 0 / 0 would show NaN
    where the panel's noValue should say why it is empty."""
    return f"({num}) / ({den} > 0)"


def _sum(by: str) -> str:
    return f"sum by ({by})" if by else "sum"


def rate_sum(series: str, sel: str, by: str = "") -> str:
    """A counter's rate summed before any ratio is taken: a ratio of sums is the figure of
    the selected series together, where an average of per-series ratios is not."""
    return f"{_sum(by)} (rate({series}{{{sel}}}{RI}))"


def rate_mean(hist: str, sel: str, by: str = "") -> str:
    """Mean of a histogram over the rate window, rate(sum) / rate(count): weighted by
    request-steps across the selected series."""
    return ratio(rate_sum(f"{hist}_sum", sel, by), rate_sum(f"{hist}_count", sel, by))


#: the walk estimate's counters: observed ceilings and ended walks' point estimates over
#: observed blocks and ended walks (resolved and censored), as the exporter's own gauge
WALK_TOKENS = (
    "dspark_estimator_observed_ceiling_tokens_total",
    "dspark_estimator_walk_point_tokens_total",
)
WALK_BLOCKS = (
    "dspark_estimator_observed_blocks_total",
    "dspark_estimator_resolved_blocks_total",
    "dspark_estimator_censored_blocks_total",
)


def walk_ceiling_mean(sel: str, by: str = "") -> str:
    """The walk's estimated mean ceiling as a ratio of the counters behind
    `dspark_ceiling_estimate_tokens{source="walk"}`, not that gauge: the gauge is one
    process's last N steps, which neither sums over series nor follows the panel's window."""
    tokens = " + ".join(rate_sum(s, sel, by) for s in WALK_TOKENS)
    blocks = " + ".join(rate_sum(s, sel, by) for s in WALK_BLOCKS)
    return ratio(tokens, blocks)


def known_or_estimated(known: str, estimated: str) -> str:
    """`known` where it has a sample, else `estimated`, series by series (matched on every
    label but `ceiling`): a workload with a shadow twin keeps its measured figure beside one
    without. The `ceiling` label tells the legend which one a series is, since the two
    differ in trust."""
    return (
        f'label_replace({known}, "{CEILING}", "{KNOWN}", "", "")'
        f" or ignoring ({CEILING}) "
        f'label_replace({estimated}, "{CEILING}", "{ESTIMATED}", "", "")'
    )


def utilisation(sel: str, by: str = "") -> str:
    """Accepted / ceiling over the rate window. Where the ceiling is known the exporter's
    trim loss counts exactly those request-steps, so 1 - trim loss / ceiling is exact; else
    the mean accepted of every request-step over the walk's mean ceiling, whose blocks are
    the observed and the walked ones (open walks lag a few steps behind)."""
    known = "1 - " + ratio(
        rate_sum("dspark_trim_loss_tokens_total", sel, by),
        rate_sum("dspark_ceiling_tokens_sum", sel, by),
    )
    estimated = ratio(rate_mean("dspark_accepted_tokens", sel, by), walk_ceiling_mean(sel, by))
    return known_or_estimated(known, estimated)


def trim_loss(sel: str, by: str = "") -> str:
    """Ceiling - accepted per request-step over the rate window, exact where the ceiling is
    known and the walk's mean ceiling less the mean accepted elsewhere, as `utilisation`."""
    known = ratio(
        rate_sum("dspark_trim_loss_tokens_total", sel, by),
        rate_sum("dspark_ceiling_tokens_count", sel, by),
    )
    estimated = f"({walk_ceiling_mean(sel, by)}) - ({rate_mean('dspark_accepted_tokens', sel, by)})"
    return known_or_estimated(known, estimated)


def utilisation_last_n(sel: str) -> str:
    """Per series over the exporter's last N steps: there, unlike over the rate window, the
    sliding gauges are the only figures, so the estimate is the sliding mean accepted over
    the walk's sliding estimate."""
    estimated = (
        f"dspark_accepted_mean_tokens{{{sel}}} / ignoring (source) "
        f'(dspark_ceiling_estimate_tokens{{{sel}, source="walk"}} > 0)'
    )
    return known_or_estimated(f"dspark_utilisation_ratio{{{sel}}}", estimated)
