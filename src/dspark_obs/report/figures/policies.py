"""What-if figure: each verify policy's predicted throughput against batch size.

Policies are not workloads, so each draws in its own `palette.series_style` (tone, line
and marker), the run's own measured points a black star. Two panels share the
batch-size axis, ticked at the batch sizes predicted: tokens/s (log scale, as
throughput grows with load) with each prediction's interval, and each policy relative
to static, where differences of a few percent and the crossings (marked on static's
zero line) are visible. The second has no bands: the policies are predicted on the same
request-steps, so the traffic's sampling error, most of each interval, is common to all
of them.

`curves` is a list of `{"policy", "levels", "tokens_per_s", "lo", "hi"}`, static first;
`own` is `{"levels", "tokens_per_s"}`; `marks` are `{"policy", "bs"}` crossings with static.
"""

from __future__ import annotations

import numpy as np

from ...palette import FAINT, MUTED, OWN_POINT, series_style
from ...plotting import batch_size_axis, legend_outside, new_figure

#: Legend entries of a policy's crossing with static, and of the run's measured points.
CROSSING, RUN = "crossing with static", "this run (measured)"

#: Horizontal offset between policies' interval bars, in log2(batch size).
DODGE = 0.04


def policies_figure(curves: list[dict], own: dict, marks: list[dict]):
    """Predicted tokens/s per policy against batch size, with 95 % intervals, and the run."""
    fig = new_figure(height=6.4)
    top, rel = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    static = dict(zip(curves[0]["levels"], curves[0]["tokens_per_s"], strict=True))
    for k, c in enumerate(curves):
        style = {**series_style(k, len(curves)), "markersize": 4}
        x = np.asarray(c["levels"], dtype=float)
        y, lo, hi = (np.asarray(c[key], dtype=float) for key in ("tokens_per_s", "lo", "hi"))
        dodge = 2.0 ** (DODGE * (k - (len(curves) - 1) / 2))  # intervals side by side
        top.errorbar(x * dodge, y, yerr=(y - lo, hi - y), capsize=2, label=c["policy"], **style)
        base = np.asarray([static[level] for level in c["levels"]], dtype=float)
        rel.plot(x, 100 * (y / base - 1), label=c["policy"], **style)
    x_own = np.asarray(own["levels"], dtype=float)
    y_own = np.asarray(own["tokens_per_s"], dtype=float)
    base_own = np.asarray([static[level] for level in own["levels"]], dtype=float)
    top.plot(x_own, y_own, label=RUN, **OWN_POINT)
    rel.plot(x_own, 100 * (y_own / base_own - 1), label=RUN, **OWN_POINT)
    if marks:
        rel.plot(
            [m["bs"] for m in marks],
            [0.0] * len(marks),
            ls="none",
            marker="X",
            markersize=9,
            markerfacecolor=FAINT,
            markeredgecolor=MUTED,
            label=CROSSING,
            zorder=6,
        )
    top.set_yscale("log")
    top.set_ylabel("tokens/s (log)")
    top.set_title(
        "Predicted throughput of each verify policy on this run's traffic (95 % intervals)"
    )
    batch_size_axis(rel, [level for c in curves for level in c["levels"]])
    top.tick_params(labelbottom=True)  # shared with the panel below, labelled on both
    for ax in (top, rel):
        ax.set_xlabel("batch size (requests per step)")
    rel.set_ylabel("vs static (%)")
    rel.set_title("Relative to static on the same request-steps (points)")
    for ax in (top, rel):
        ax.grid(alpha=0.3)
    entries = dict(zip(*reversed(top.get_legend_handles_labels()), strict=True))
    entries[RUN] = entries.pop(RUN)  # the policies first, then the run
    if marks:
        entries[CROSSING] = rel.get_legend_handles_labels()[0][-1]
    labels, handles = list(entries), list(entries.values())
    legend_outside(fig, handles, labels, title="policy")
    return fig
