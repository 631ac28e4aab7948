"""The fleet dashboard's figures as PromQL over counters only, for any grouping and window.

A ratio gauge of one process (ECE, utilisation, ...) cannot be averaged across ranks or
nodes; its sufficient statistics can be summed over any set of series, and the ratio taken
after the sum is that set's figure. Each function here writes one figure that way, the same
expressions as deploy/rules/fleet.yml, with the grouping (`by`) and the window chosen by the
panel: `window=None` sums the counters as they stand (the figure since each exporter
started, what the `:ratio` rules record), a window such as `$__rate_interval` sums their
rates (the `:ratio_rate5m` rules' form).

Two levels of series: `NODE` reads the `instance:<name>:sum` series fleet.yml's node group
records per exporter (what a global Prometheus federates; `rank` is summed away), `RANK` the
exporter's own counters (on the node's Prometheus, or wherever they are shipped whole).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial


def _counter(name: str) -> tuple[str, str]:
    """A counter's node sum (fleet.yml's `instance:<name>:sum`) and the counter itself."""
    return f"instance:{name}:sum", f"{name}_total"


def _histogram(name: str) -> tuple[str, str]:
    """A histogram's `_sum` or `_count` series: its node sum and the series itself."""
    return f"instance:{name}:sum", name


#: counter key: (its node-level `instance:` series, the exporter's own counter)
COUNTERS = {
    "rows": _counter("dspark_confidence_bin_rows"),
    "positives": _counter("dspark_confidence_bin_positives"),
    "predicted": _counter("dspark_confidence_bin_predicted"),
    "labelled": _counter("dspark_confidence_labelled"),
    "position_positives": _counter("dspark_confidence_positives"),
    "positive_predicted": _counter("dspark_confidence_positive_predicted"),
    "predicted_squared": _counter("dspark_confidence_predicted_squared"),
    "negatives_below": _counter("dspark_confidence_bin_negatives_below"),
    "ceiling_sum": _histogram("dspark_ceiling_tokens_sum"),
    "ceiling_count": _histogram("dspark_ceiling_tokens_count"),
    "trim_loss": _counter("dspark_trim_loss_tokens"),
    "observed_blocks": _counter("dspark_estimator_observed_blocks"),
    "observed_ceiling": _counter("dspark_estimator_observed_ceiling_tokens"),
    # ended walks, resolved and censored: the walks' denominator
    "walked": (
        "instance:dspark_estimator_walked_blocks:sum",
        ("dspark_estimator_resolved_blocks_total", "dspark_estimator_censored_blocks_total"),
    ),
    "walk_lower": _counter("dspark_estimator_walk_lower_tokens"),
    "walk_point": _counter("dspark_estimator_walk_point_tokens"),
    "walk_upper": _counter("dspark_estimator_walk_upper_tokens"),
    "request_steps": _counter("dspark_request_steps"),
    "committed": _histogram("dspark_committed_tokens_sum"),
    "accepted": _histogram("dspark_accepted_tokens_sum"),
    "window": _histogram("dspark_window_tokens_sum"),
}

_NODE_SEL = (
    'engine=~"$engine", model_name=~"$model_name", cluster=~"$cluster", instance=~"$instance", '
    'workload=~"$workload", mode=~"$mode"'
)


@dataclass(frozen=True)
class Level:
    """Which series a query reads and how they are filtered by the template variables."""

    rank: bool  # the exporter's own counters (per rank) rather than fleet.yml's node sums
    selector: str

    def series(self, key: str, window: str | None = None) -> str:
        """The counter's series, or their rates over `window`. Two counters of one family
        (resolved and censored walks) are kept apart by a label of their own, since their rates
        share every label once rate() drops the name."""
        names = COUNTERS[key][1 if self.rank else 0]
        parts = []
        for i, name in enumerate((names,) if isinstance(names, str) else names):
            s = f"{name}{{{self.selector}}}"
            s = s if window is None else f"rate({s}[{window}])"
            parts.append(s if i == 0 else f'label_replace({s}, "family", "{i}", "", "")')
        return " or ".join(parts)


NODE = Level(rank=False, selector=_NODE_SEL)
RANK = Level(rank=True, selector=f'{_NODE_SEL}, rank=~"$rank"')


def _by(labels: tuple[str, ...]) -> str:
    return f"sum by ({', '.join(labels)})" if labels else "sum"


def total(level: Level, key: str, by: tuple[str, ...], window: str | None) -> str:
    """One counter summed over `by`: as it stands, or its per-second rate over `window`."""
    return f"{_by(by)} ({level.series(key, window)})"


def _ratio(num: str, den: str) -> str:
    """`num / den` where den > 0: an idle group records nothing rather than NaN."""
    return f"({num}) / ({den} > 0)"


def per_request_step(level: Level, key: str, by: tuple[str, ...], window: str | None = None) -> str:
    """Mean tokens per request-step (accepted, window, committed) as sum / request-steps."""
    t = partial(total, level, by=by, window=window)
    return _ratio(t(key), t("request_steps"))


def ece(level: Level, by: tuple[str, ...], window: str | None = None) -> str:
    """Sum over bins of |predicted - positives|, over rows; bins pooled over what `by` drops."""
    t = partial(total, level, by=(*by, "bin"), window=window)
    return _ratio(
        f"{_by(by)} (abs({t('predicted')} - {t('positives')}))",
        total(level, "rows", by, window),
    )


def brier(level: Level, by: tuple[str, ...], window: str | None = None) -> str:
    """(sum p^2 - 2 sum of positives' p + positives) / rows, from the per-position counters
    (per rank, where the bins are summed over ranks)."""
    t = partial(total, level, by=by, window=window)
    return _ratio(
        f"{t('predicted_squared')} - 2 * {t('positive_predicted')} + {t('position_positives')}",
        t("labelled"),
    )


def auroc(level: Level, by: tuple[str, ...], window: str | None = None) -> str:
    """Per ECE bin, positives x (negatives below + half the bin's negatives, its ties), over
    positives x negatives; a bin's negatives are its rows less its positives."""
    t = partial(total, level, by=(*by, "bin"), window=window)
    on, on_bin = ", ".join(by), ", ".join((*by, "bin"))
    negatives = f"({t('rows')} - on ({on_bin}) {t('positives')})"
    pairs = (
        f"{_by(by)} ({t('positives')} * on ({on_bin}) "
        f"({t('negatives_below')} + on ({on_bin}) 0.5 * {negatives}))"
    )
    g = partial(total, level, by=by, window=window)
    return _ratio(pairs, f"{g('positives')} * on ({on}) ({g('rows')} - on ({on}) {g('positives')})")


def reliability(level: Level, by: tuple[str, ...], window: str | None = None) -> str:
    """Observed share of accepted prefixes per ECE bin: positives / rows (by adds `bin`)."""
    t = partial(total, level, by=(*by, "bin"), window=window)
    return _ratio(t("positives"), t("rows"))


def utilisation(level: Level, by: tuple[str, ...], window: str | None = None) -> str:
    """Accepted / ceiling where the ceiling is known: (ceiling - trim loss) / ceiling."""
    t = partial(total, level, by=by, window=window)
    return _ratio(f"{t('ceiling_sum')} - {t('trim_loss')}", t("ceiling_sum"))


def utilisation_estimate(level: Level, by: tuple[str, ...], window: str | None = None) -> str:
    """Accepted per request-step over the estimated mean ceiling: utilisation where no ceiling
    is known (compact without a shadow twin), from the walk's counters alone."""
    return _ratio(
        per_request_step(level, "accepted", by, window),
        ceiling_estimate(level, "point", by, window),
    )


def ceiling_mean(level: Level, by: tuple[str, ...], window: str | None = None) -> str:
    """Mean ceiling over request-steps whose ceiling is known (observed or shadow)."""
    t = partial(total, level, by=by, window=window)
    return _ratio(t("ceiling_sum"), t("ceiling_count"))


#: the walk sum behind each bound of the ceiling estimate
BOUNDS = {"lower": "walk_lower", "point": "walk_point", "upper": "walk_upper"}


def ceiling_estimate(
    level: Level, bound: str, by: tuple[str, ...], window: str | None = None
) -> str:
    """(observed ceilings + the ended walks' bound) / (observed blocks + ended walks)."""
    t = partial(total, level, by=by, window=window)
    return _ratio(
        f"{t('observed_ceiling')} + {t(BOUNDS[bound])}",
        f"{t('observed_blocks')} + {t('walked')}",
    )
