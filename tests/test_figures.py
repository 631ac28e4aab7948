"""Every report figure, inspected as a matplotlib object rather than as pixels.

The figures are built from a real run (the session's compact run with a cap-accept
shadow, so every figure has data) by the report's own sections; a queue that keeps
the figures instead of writing PNGs stands in for the file writer. Each figure must
have a title, axis labels and a legend outside its plots that names only artists it
drew (a key of marker sizes aside), its text inside the image and its tick labels as
the tables write numbers; every artist tagged with a workload must be that workload's
one colour, and any two of its other series differ in colour, line style or marker.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dspark_obs.estimator.evaluate import evaluate
from matplotlib.colors import to_hex
from matplotlib.ticker import ScalarFormatter

from dspark_obs.analysis.reliability import calibration_histograms
from dspark_obs.analysis.summary import summarize
from dspark_obs.numbers import number
from dspark_obs.palette import WORKLOAD_COLOURS, series_style, workload_palette
from dspark_obs.plotting import NumberTicks, number_ticks
from dspark_obs.report.arms import TRACED_REQUESTS, analyse, arms_palette, predict_policies
from dspark_obs.report.document import Figure
from dspark_obs.report.figure_queue import FigureQueue
from dspark_obs.report.figures import calibration as calibration_fig
from dspark_obs.report.figures import load as load_fig
from dspark_obs.report.figures import policies as policies_fig
from dspark_obs.report.figures import requests as requests_fig
from dspark_obs.report.figures import workloads as workloads_fig
from dspark_obs.report.sections import (
    calibration_section,
    cost_section,
    estimator_section,
    load_section,
    policies_section,
    requests_section,
    workloads_section,
)
from dspark_obs.store import open_run


class KeepFigures(FigureQueue):
    """The report's queue, keeping each figure object and caption by stem instead of saving."""

    def __init__(self) -> None:
        super().__init__(Path("."), background=False)
        self.figures: dict = {}
        self.captions: dict[str, str] = {}

    def save(self, section, make, args, stem, caption):
        self.figures[stem] = make(*args)
        self.captions[stem] = caption
        return Figure(Path(f"{stem}.png"), caption)


@pytest.fixture(scope="module")
def built(compact_run):
    run = open_run(compact_run[0])
    arm = analyse("compact", run, 5)
    arms, w = [arm], KeepFigures()
    load_section(arms, w)
    cost_section(arms, w)
    requests_section(arms, w, 5)
    predict_policies(arm)
    policies_section(arms, w)
    arm.estimate = evaluate(run)
    workloads_section(arms, w)
    estimator_section(arms, w)
    arm.calibration = calibration_histograms(run)
    calibration_section(arms, w)
    for fig in w.figures.values():
        number_ticks(fig)  # as `save_png` does before writing
    return arms, w.figures, w.captions


def _has_data(artist) -> bool:
    if hasattr(artist, "get_xdata"):
        return len(artist.get_xdata()) > 0
    if hasattr(artist, "get_offsets"):
        return len(artist.get_offsets()) > 0
    return len(artist) > 0  # a bar container


def drawn_labels(fig) -> set[str]:
    out = set()
    for ax in fig.axes:
        for artist in [*ax.containers, *ax.lines, *ax.collections]:
            label = artist.get_label()
            if label and not label.startswith("_") and _has_data(artist):
                out.add(label)
    return out


def legends(fig) -> list:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


def is_size_key(legend) -> bool:
    """A key of marker areas names sizes, not artists."""
    return legend.get_title().get_text() == calibration_fig.SIZE_TITLE


def assert_readable(stem: str, fig) -> None:
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert shown, stem
    suptitle = fig._suptitle.get_text() if fig._suptitle else ""
    assert suptitle or all(ax.get_title() for ax in shown), f"{stem}: no title"
    for ax in shown:
        assert ax.get_xlabel() and ax.get_ylabel(), f"{stem}: {ax.get_title()!r} lacks a label"
    boxes = legends(fig)
    assert boxes, f"{stem}: no legend"
    named = {t.get_text() for b in boxes if not is_size_key(b) for t in b.get_texts()}
    assert named <= drawn_labels(fig), f"{stem}: legend names {named - drawn_labels(fig)}"
    fig.draw_without_rendering()
    for legend in boxes:
        box = legend.get_window_extent()
        for ax in shown:
            assert not box.overlaps(ax.get_window_extent()), f"{stem}: legend over the data"
    image = fig.bbox
    for ax in shown:
        for text in [*ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label]:
            box = text.get_window_extent()
            inside = image.x0 <= box.x0 and box.x1 <= image.x1 and image.y0 <= box.y0
            assert inside and box.y1 <= image.y1, f"{stem}: {text.get_text()[:40]!r} off the image"


def series_keys(ax) -> list[tuple[str, str, str]]:
    """(colour, line style, marker) of each labelled line of an axes."""
    return [
        (to_hex(line.get_color()), line.get_linestyle(), str(line.get_marker()))
        for line in ax.lines
        if not line.get_label().startswith("_")
    ]


def assert_distinct_series(stem: str, fig) -> None:
    for ax in fig.axes:
        keys = series_keys(ax)
        assert len(set(keys)) == len(keys), f"{stem}: series drawn alike {keys}"


def workload_colours(fig) -> dict[str, set[str]]:
    """`gid="workload=NAME"` artists -> the hues they are drawn in (a hatched bar's is its
    edge; a collection of bars, each of its faces')."""
    out: dict[str, set[str]] = {}
    for ax in fig.axes:
        for artist in [*ax.patches, *ax.lines, *ax.collections]:
            gid = artist.get_gid() or ""
            if not gid.startswith("workload="):
                continue
            if hasattr(artist, "get_facecolor"):
                faces = np.atleast_2d(artist.get_facecolor())
                edges = np.atleast_2d(artist.get_edgecolor())
                assert len(faces), gid
                hues = {
                    to_hex(edges[i % len(edges)]) if to_hex(face) == "#ffffff" else to_hex(face)
                    for i, face in enumerate(faces)
                }
            else:
                hues = {to_hex(artist.get_color())}
            out.setdefault(gid.removeprefix("workload="), set()).update(hues)
    return out


def test_every_figure_has_title_labels_and_an_honest_legend_outside(built):
    _, figures, _ = built
    assert len(figures) == 15, sorted(figures)
    for stem, fig in figures.items():
        assert_readable(stem, fig)
        assert_distinct_series(stem, fig)


def test_a_workload_has_one_colour_in_every_figure(built):
    arms, figures, _ = built
    palette = arms_palette(arms)
    names = set(arms[0].summary["workloads"])
    assert len(names) >= 3
    assert len({palette[n] for n in names}) == len(names)  # distinct hues
    seen: dict[str, set[str]] = {}
    coloured = 0
    for fig in figures.values():
        per_fig = workload_colours(fig)
        coloured += bool(per_fig)
        for name, hues in per_fig.items():
            seen.setdefault(name, set()).update(hues)
    assert coloured >= 6  # workloads, windows, estimates, survival, top requests, traces
    assert seen.keys() == {str(n) for n in names}
    for name, hues in seen.items():
        assert hues == {palette[name]}, (name, hues, palette[name])


def test_palette_depends_on_the_names_not_their_order():
    a = workload_palette(["poetry", "arena", None, "gsm8k"])
    b = workload_palette(["gsm8k", "poetry", "arena", "poetry", None])
    assert a == b
    assert a["arena"] == WORKLOAD_COLOURS[0] and a["poetry"] == WORKLOAD_COLOURS[2]
    assert a[None] not in WORKLOAD_COLOURS


def test_compare_bars_name_only_the_ceilings_drawn(compact_run):
    """`compare --out` has no estimator pass: no estimated-ceiling bar, so no such entry."""
    summary = summarize(open_run(compact_run[0]))
    rows = [{"workload": k, **v} for k, v in summary["workloads"].items()]
    palette = workload_palette(summary["workloads"])
    fig = workloads_fig.workload_figure([("a", rows), ("b", rows)], 7, palette)
    assert_readable("compare workloads", fig)
    named = {t.get_text() for t in fig.legends[0].get_texts()}
    assert named == {"window", "accepted", "ceiling (observed)"}
    no_ceiling = [{**r, "mean_ceiling": None} for r in rows]
    fig = workloads_fig.workload_figure([("a", no_ceiling)], 7, palette)
    assert {t.get_text() for t in fig.legends[0].get_texts()} == {"window", "accepted"}


def test_policy_figure_draws_each_predicted_policy_and_the_run(built):
    """One line per policy the report predicted (not `own`: the run is its measured points),
    at the whatif cells' tokens/s, and the run's points at its own."""
    arms, figures, _ = built
    fig = figures["policies-compact"]
    top, rel = fig.axes
    cells = [c for c in arms[0].whatif["cells"] if c["workload"] == "all"]
    policies = list(dict.fromkeys(c["policy"] for c in cells))
    assert policies[:2] == ["own", "static"] and "sps:sts=none" in policies
    lines = {line.get_label(): line for line in top.lines if not line.get_label().startswith("_")}
    legend = {t.get_text() for t in fig.legends[0].get_texts()}
    assert legend - {"crossing with static"} == {*policies[1:], "this run (measured)"}
    assert {c.get_label() for c in top.containers} == set(policies[1:])
    for policy in [*policies[1:], "own"]:
        own = policy == "own"
        ys = [c["tokens_per_s"] for c in cells if c["policy"] == policy]
        line = (
            lines["this run (measured)"] if own else top.containers[policies.index(policy) - 1][0]
        )
        assert list(line.get_ydata()) == pytest.approx(ys, rel=1e-12), policy
    static = [c["tokens_per_s"] for c in cells if c["policy"] == "static"]
    for line in rel.lines:
        if line.get_label() == "static":
            assert list(line.get_ydata()) == pytest.approx([0.0] * len(static), abs=1e-9)


def tick_texts(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels() if t.get_text()]


def test_series_styles_stay_distinct_past_every_cycle():
    """Any number of series that are not workloads: all (colour, line, marker) differ, the
    line-and-marker pair alone for the first 28, and none takes a workload's hue."""
    for n in (1, 2, 4, 7, 12, 30):
        styles = [series_style(i, n) for i in range(n)]
        assert len({(s["color"], s["ls"], s["marker"]) for s in styles}) == n
        assert not {s["color"] for s in styles} & set(WORKLOAD_COLOURS)
    pairs = [(s["ls"], s["marker"]) for s in (series_style(i, 28) for i in range(28))]
    assert len(set(pairs)) == 28
    curves = [
        {"policy": f"p{k}", "levels": [1, 8, 64], "tokens_per_s": [1e3, 8e3, 6e4]} for k in range(9)
    ]
    for c in curves:
        c["lo"], c["hi"] = c["tokens_per_s"], c["tokens_per_s"]
    own = {"levels": [1, 8, 64], "tokens_per_s": [1e3, 8e3, 6e4]}
    assert_distinct_series("9 policies", policies_fig.policies_figure(curves, own, []))
    load = pl.DataFrame({"bs": [1, 8, 64], "mean_step_ms": [7.5, 8.0, 12.0]})
    arms = [(f"run {k}", load) for k in range(12)]
    assert_distinct_series("12 runs", load_fig.step_time_figure(arms))


def test_number_ticks_write_numbers_as_the_tables_do():
    ticks = NumberTicks()
    assert ticks.format_ticks([0.0, 2500.0, 50000.0]) == ["0", "2,500", "50,000"]
    assert ticks.format_ticks([0.0, 0.5, 1.0]) == ["0.0", "0.5", "1.0"]
    assert ticks.format_ticks([-0.0, 0.012, 0.1]) == ["0.000", "0.012", "0.100"]


def test_batch_size_axes_tick_at_the_batch_sizes_and_numbers_carry_separators(built):
    """Not 2^k: the policies' shared axis is labelled on both panels with the sizes predicted,
    the load figures' with the sizes measured; no axis is left on matplotlib's formatter."""
    arms, figures, _ = built
    top, rel = figures["policies-compact"].axes
    cells = [c for c in arms[0].whatif["cells"] if c["workload"] == "all"]
    sizes = [number(int(b)) for b in sorted({c["level"] for c in cells})]
    for stem, fig in figures.items():
        fig.draw_without_rendering()
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                assert not isinstance(axis.get_major_formatter(), ScalarFormatter), stem
                assert not any("$" in t or "e+" in t for t in tick_texts(axis)), stem
    assert tick_texts(rel.xaxis) == tick_texts(top.xaxis) == sizes
    log_ticks = tick_texts(top.yaxis)
    assert log_ticks and all(re.fullmatch(r"\d{1,3}(,\d{3})*", t) for t in log_ticks)
    assert any("," in t for t in log_ticks), log_ticks
    measured = [number(int(b)) for b in arms[0].load["bs"].to_list()]
    for stem in ("step-time", "budget"):
        assert tick_texts(figures[stem].axes[0].xaxis) == measured, stem


def test_reliability_diagrams_show_the_diagonal_the_corners_and_a_size_key(built):
    _, figures, _ = built
    fig = figures["reliability-compact"]
    shown = [ax for ax in fig.axes if ax.get_visible()]
    for ax in shown:
        (lo, hi), (bottom, top) = ax.get_xlim(), ax.get_ylim()
        assert lo < 0 and hi > 1 and bottom < 0 and top > 1  # a bin at (1, 1) shows whole
        diagonal = [ln for ln in ax.lines if ln.get_label() == calibration_fig.PERFECT]
        assert len(diagonal) == 1
        assert list(diagonal[0].get_xdata()) == list(diagonal[0].get_ydata()) == [0, 1]
    (key,) = [legend for legend in fig.legends if is_size_key(legend)]
    areas = [h.get_markersize() ** 2 for h in key.legend_handles]
    c = calibration_fig
    assert areas == pytest.approx([c.BASE_AREA + c.AREA * s for s in c.SIZE_KEY])


def test_traces_draw_a_dash_per_trimmed_step_under_a_legend_that_says_whose(built):
    """A dash per trimmed step with a ceiling, as wide as its bar; the legend names the
    ceiling's source as the run has it; the caption says why fewer than the table's rows."""
    arms, figures, captions = built
    arm = arms[0]
    fig = figures["traces-compact"]
    rids = arm.top["rid"].head(TRACED_REQUESTS).to_list()
    assert f"the first {len(rids)} of the table's {arm.top.height}" in captions["traces-compact"]
    assert f"the {len(rids)} requests" in fig._suptitle.get_text()
    assert fig.legends[0].get_texts()[-1].get_text() == requests_fig._CEILING[True]
    for ax, rid in zip(fig.axes, rids, strict=True):
        part = arm.traces.filter(pl.col("rid") == rid)
        w, a = part["window"].to_numpy(), part["correct_drafts"].to_numpy()
        known = part["ceiling_best"].is_not_null().to_numpy()
        trimmed = (a == w) & (w < arm.gamma) & known
        dashes = [c for c in ax.collections if c.get_label() == requests_fig._CEILING[True]]
        segments = dashes[0].get_segments() if dashes else []
        assert len(segments) == trimmed.sum(), rid
        for seg in segments:
            assert seg[1][0] - seg[0][0] == pytest.approx(requests_fig._DASH_WIDTH)
    walked = requests_fig.traces_figure(
        "walked", arm.traces, rids, arms_palette(arms), arm.gamma, False
    )
    labels = [t.get_text() for t in walked.legends[0].get_texts()]
    assert labels[-1] == requests_fig._CEILING[False]
    assert requests_fig._CEILING[True] not in labels
    assert np.all([ax.get_ylim()[1] > arm.gamma for ax in walked.axes])


def test_no_survival_figure_without_a_population_model(built):
    """A fleet's estimate has no population model: no panels left empty, a line says why."""
    arms, _, _ = built
    estimate = arms[0].estimate
    walks_only = {
        name: {k: v for k, v in entry.items() if k != "population"}
        for name, entry in estimate["workloads"].items()
    }
    arm = dataclasses.replace(arms[0], estimate={**estimate, "workloads": walks_only})
    w = KeepFigures()
    section = estimator_section([arm], w)
    assert set(w.figures) == {"estimates-compact"}
    assert any("no survival curves" in line for line in section.missing)


def test_estimates_title_claims_a_truth_only_where_one_is_drawn(built):
    """Without a shadow the estimates are not held against anything; the title says so."""
    from dspark_obs.report.figures import estimator as estimator_fig

    arms, _, _ = built
    estimate = arms[0].estimate
    palette = workload_palette(estimate["workloads"])
    with_truth = {n: {**e, "truth": 3.0} for n, e in estimate["workloads"].items()}
    without = {n: {**e, "truth": None} for n, e in estimate["workloads"].items()}
    titles = [
        estimator_fig.estimates_figure("x", {**estimate, "workloads": w}, palette)
        .axes[0]
        .get_title()
        for w in (with_truth, without)
    ]
    assert titles == [
        "x: estimated vs true ceiling per workload",
        "x: estimated ceiling (no shadow truth) per workload",
    ]
