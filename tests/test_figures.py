"""Every report figure, inspected as a matplotlib object rather than as pixels.

The figures are built from a real run (the session's compact run with a cap-accept
shadow, so every figure has data) by the report's own sections; a queue that keeps
the figures instead of writing PNGs stands in for the file writer. Each figure must
have a title, axis labels and a legend outside its plots that names only artists it
drew, and every artist tagged with a workload must be that workload's one colour.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dspark_obs.estimator.evaluate import evaluate
from matplotlib.colors import to_hex

from dspark_obs.analysis.reliability import calibration_histograms
from dspark_obs.analysis.summary import summarize
from dspark_obs.palette import WORKLOAD_COLOURS, workload_palette
from dspark_obs.report.arms import analyse, arms_palette, predict_policies
from dspark_obs.report.document import Figure
from dspark_obs.report.figure_queue import FigureQueue
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
    """The report's queue, keeping each figure object by stem instead of saving it."""

    def __init__(self) -> None:
        super().__init__(Path("."), background=False)
        self.figures: dict = {}

    def save(self, section, make, args, stem, caption):
        self.figures[stem] = make(*args)
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
    return arms, w.figures


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


def assert_readable(stem: str, fig) -> None:
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert shown, stem
    suptitle = fig._suptitle.get_text() if fig._suptitle else ""
    assert suptitle or all(ax.get_title() for ax in shown), f"{stem}: no title"
    for ax in shown:
        assert ax.get_xlabel() and ax.get_ylabel(), f"{stem}: {ax.get_title()!r} lacks a label"
    boxes = legends(fig)
    assert boxes, f"{stem}: no legend"
    named = {t.get_text() for legend in boxes for t in legend.get_texts()}
    assert named <= drawn_labels(fig), f"{stem}: legend names {named - drawn_labels(fig)}"
    fig.draw_without_rendering()
    for legend in boxes:
        box = legend.get_window_extent()
        for ax in shown:
            assert not box.overlaps(ax.get_window_extent()), f"{stem}: legend over the data"


def workload_colours(fig) -> dict[str, set[str]]:
    """`gid="workload=NAME"` artists -> the hues they are drawn in (a hatched bar's is its edge)."""
    out: dict[str, set[str]] = {}
    for ax in fig.axes:
        for artist in [*ax.patches, *ax.lines]:
            gid = artist.get_gid() or ""
            if not gid.startswith("workload="):
                continue
            if hasattr(artist, "get_facecolor"):
                face = to_hex(artist.get_facecolor())
                hue = to_hex(artist.get_edgecolor()) if face == "#ffffff" else face
            else:
                hue = to_hex(artist.get_color())
            out.setdefault(gid.removeprefix("workload="), set()).add(hue)
    return out


def test_every_figure_has_title_labels_and_an_honest_legend_outside(built):
    _, figures = built
    assert len(figures) == 15, sorted(figures)
    for stem, fig in figures.items():
        assert_readable(stem, fig)


def test_a_workload_has_one_colour_in_every_figure(built):
    arms, figures = built
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
    arms, figures = built
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
