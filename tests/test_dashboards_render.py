"""`dspark-obs dashboards render`: every panel drawn from a real Prometheus scraping `serve`."""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import pytest

pytest.importorskip("grafana_foundation_sdk")
pytest.importorskip("matplotlib")

import matplotlib.image
import numpy as np
from matplotlib.colors import to_hex

from dspark_obs.dashboards import generate
from dspark_obs.dashboards.drawing import data_panels, slug
from dspark_obs.dashboards.panel_plots import draw_panel
from dspark_obs.dashboards.querying import PanelData, Series, substitute, substitutions
from dspark_obs.dashboards.values import NAMED_COLOURS

from .conftest import cli
from .live_exporter import serve_scraped
from .prometheus_harness import free_port, prometheus_available


def test_substitute_variables() -> None:
    values = substitutions({"workload": 'a"b'}, step="30s", range_="1h")
    expr = (
        'rate(x{workload=~"$workload", rank=~"${rank}"}[$__rate_interval]) [$__range] $__interval'
    )
    assert substitute(expr, values) == ('rate(x{workload=~"a\\"b", rank=~".*"}[1m]) [1h] 30s')
    for p in data_panels(generate()):
        for t in p["targets"]:
            assert "$" not in substitute(t["expr"]), t["expr"]
    assert slug("Refit R²") == "refit-r"


def test_unreachable_prometheus_exits_2(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = cli("dashboards", "render", "--prometheus", url, "--out", str(tmp_path), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "cannot reach Prometheus at" in proc.stderr and url in proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not list(tmp_path.iterdir())  # nothing written on failure


@pytest.mark.skipif(not prometheus_available(), reason="needs prometheus (tools/test.sh)")
def test_render_every_panel(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    prom = serve_scraped(tmp_path, request)

    out = tmp_path / "render"
    proc = cli(
        "dashboards", "render",
        "--prometheus", prom.url,
        "--out", str(out),
        "--range", "1m",
        "--step", "2s",
        "--var", "instance=.*",
    )  # fmt: skip
    panels = data_panels(generate())
    pngs = sorted(out.glob("[0-9][0-9]-*.png"))
    assert [p.name for p in pngs] == [
        f"{i:02d}-{slug(p['title'])}.png" for i, p in enumerate(panels, start=1)
    ]
    assert (out / "overview.png").exists() and (out / "index.html").exists()
    assert "Warning" not in proc.stderr, proc.stderr
    summary = proc.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"rendered {len(panels)} panels"), proc.stdout
    committed = next(line for line in proc.stdout.splitlines() if "committed-tokens-s" in line)
    assert "no data" not in committed, proc.stdout  # the panel whose data was waited for

    for png in [*pngs, out / "overview.png"]:
        pixels = matplotlib.image.imread(png)[..., :3]
        assert pixels.var() > 0, f"{png.name} is blank"
        assert not np.all(pixels >= 0.999), f"{png.name} is all white"

    page = (out / "index.html").read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == len(pngs) + 1
    for p in panels:
        assert f"<b>{html.escape(p['title'])}</b>" in page, p["title"]


def _panel(title: str) -> dict:
    return next(p for p in data_panels(generate()) if p["title"] == title)


def _drawn(panel: dict, series: list[Series]):
    from dspark_obs.plotting import new_figure

    fig = new_figure()
    ax = fig.add_subplot()
    draw_panel(ax, PanelData(panel, series))
    return ax


def test_stat_is_a_big_number_in_its_unit_and_threshold_colour() -> None:
    """As Grafana draws a stat: `10,432`, `264 µs`, `90.00%` in yellow, never `1e+04`."""
    cases = [
        ("Committed tokens/s", [10432.4], ["10,432"], None),
        ("Refit RMS error", [0.000264], ["264 µs"], None),
        ("Utilisation", [0.9], ["90.00%"], NAMED_COLOURS["yellow"]),
        ("Utilisation", [0.5], ["50.00%"], NAMED_COLOURS["red"]),
        ("Refit R²", [0.0046], ["0.005"], NAMED_COLOURS["red"]),
        ("Sources up", [1.0, 0.0], ["1", "0"], None),
    ]
    for title, values, texts, colour in cases:
        series = [Series(f"s{i}", [0.0, 15.0], [v, v]) for i, v in enumerate(values)]
        ax = _drawn(_panel(title), series)
        big = [t for t in ax.texts if t.get_gid() == "stat-value"]
        assert [t.get_text() for t in big] == texts, title
        if colour is not None:
            assert {to_hex(t.get_color()) for t in big} == {colour.lower()}, title
        assert not ax.patches, f"{title}: drawn as bars"
    up = [
        t
        for t in _drawn(
            _panel("Sources up"), [Series("a", [0.0], [1.0]), Series("b", [0.0], [0.0])]
        ).texts
    ]
    colours = {t.get_text(): to_hex(t.get_color()) for t in up if t.get_gid() == "stat-value"}
    assert colours == {"1": NAMED_COLOURS["green"].lower(), "0": NAMED_COLOURS["red"].lower()}


def test_heatmap_shows_only_buckets_that_hold_data() -> None:
    bounds = [1.0, 2.0, 4.0, 8.0, 16.0, math.inf]
    counts = [0.0, 0.0, 3.0, 0.0, 5.0, 0.0]
    series = [Series(f"{b:g}", [0.0, 15.0], [c, c], b) for b, c in zip(bounds, counts, strict=True)]
    ax = _drawn(_panel("Batch size distribution"), series)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["≤ 4", "≤ 8", "≤ 16"]


def test_every_per_rank_legend_names_the_instance() -> None:
    """Two exporters' rank 0 must not share a legend entry (nor be summed together)."""
    for p in data_panels(generate()):
        for t in p["targets"]:
            if "{{rank}}" in t["legendFormat"]:
                assert "{{instance}}" in t["legendFormat"], (p["title"], t["legendFormat"])
                assert "by (mode, rank)" not in t["expr"], (p["title"], t["expr"])


def test_lines_take_their_workloads_colour_from_the_shared_palette() -> None:
    """A workload keeps one hue across panels (mode and rank differ by line style), chosen
    over every panel drawn together; series without a workload take no workload's hue."""
    from dspark_obs.dashboards.panel_plots import panel_palette
    from dspark_obs.palette import WORKLOAD_COLOURS

    def s(workload, label):
        return Series(label, [0.0, 15.0], [1.0, 2.0], workload=workload)

    both = PanelData(
        _panel("Window vs ceiling by workload"),
        [s("poetry", "p c"), s("gsm8k", "g c"), s("poetry", "p s"), s("gsm8k", "g s")],
    )
    alone = PanelData(_panel("Utilisation by workload"), [s("poetry", "p c")])
    palette = panel_palette([both, alone])
    assert palette == {"gsm8k": WORKLOAD_COLOURS[0], "poetry": WORKLOAD_COLOURS[1]}

    from dspark_obs.plotting import new_figure

    fig = new_figure()
    ax = fig.add_subplot()
    draw_panel(ax, both, palette=palette)
    drawn = {ln.get_label(): (to_hex(ln.get_color()), ln.get_linestyle()) for ln in ax.lines}
    assert drawn["p c"][0] == drawn["p s"][0] == WORKLOAD_COLOURS[1]
    assert drawn["g c"][0] == drawn["g s"][0] == WORKLOAD_COLOURS[0]
    assert drawn["p c"][1] != drawn["p s"][1] and drawn["g c"][1] != drawn["g s"][1]
    ax = fig.add_subplot()
    draw_panel(ax, alone, palette=palette)
    assert to_hex(ax.lines[0].get_color()) == WORKLOAD_COLOURS[1]

    ax = _drawn(_panel("Predicted vs measured step time"), [s(None, "r0"), s(None, "r1")])
    assert len({to_hex(line.get_color()) for line in ax.lines}) == 2
    assert not {to_hex(line.get_color()) for line in ax.lines} & set(WORKLOAD_COLOURS)


def test_grafana_keeps_a_series_colour_by_its_name() -> None:
    for p in data_panels(generate()):
        if p["type"] == "timeseries":
            assert p["fieldConfig"]["defaults"]["color"]["mode"] == "palette-classic-by-name"


def _series(labels, values=(1.0, 2.0), span=15.0, workload=None) -> list[Series]:
    return [Series(label, [0.0, span], list(values), workload=workload) for label in labels]


def _keys(ax) -> list[tuple[str, str, str]]:
    return [(to_hex(ln.get_color()), ln.get_linestyle(), str(ln.get_marker())) for ln in ax.lines]


def test_every_series_of_a_panel_is_drawn_apart() -> None:
    """Seven positions (more than the line styles), twelve series of one workload (more than
    the markers): no two share colour, line style and marker; the positions take no
    workload's hue."""
    from dspark_obs.palette import WORKLOAD_COLOURS

    ax = _drawn(_panel("ECE by position"), _series([f"position {j}" for j in range(7)]))
    keys = _keys(ax)
    assert len(keys) == len(set(keys)) == 7
    assert not {k[0] for k in keys} & set(WORKLOAD_COLOURS)
    many = _series([f"r{k} @host:{k}" for k in range(12)], workload="poetry")
    keys = _keys(_drawn(_panel("Utilisation by workload"), many))
    assert len(keys) == len(set(keys)) == 12


def test_series_named_by_numbers_are_in_numeric_order() -> None:
    """Prometheus sorts `1024+` before `128+`; the legend reads 128, 256, 1024, each mode
    apart."""
    labels = [f"{m} context {c}+" for m in ("compact", "static") for c in (1024, 128, 256)]
    ax = _drawn(_panel("Cost-table drift by context length"), _series(labels))
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        f"{m} context {c}+" for m in ("compact", "static") for c in (128, 256, 1024)
    ]


def test_step_times_read_in_milliseconds() -> None:
    ax = _drawn(_panel("Predicted vs measured step time"), _series(["r0"], (0.012, 0.0125)))
    assert ax.get_ylabel() == "ms"
    assert list(ax.lines[0].get_ydata()) == pytest.approx([12.0, 12.5])


def test_histogram_bars_leave_out_an_empty_inf_bucket() -> None:
    def buckets(inf_count):
        counts = [5.0, 9.0, 3.0, inf_count]
        return [
            Series(le, [0.0], [c], le=float(le.replace("+Inf", "inf")))
            for le, c in zip(["0", "1", "2", "+Inf"], counts, strict=True)
        ]

    ax = _drawn(_panel("Verify-length distribution"), buckets(0.0))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    ax = _drawn(_panel("Verify-length distribution"), buckets(2.0))
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "> 2"]


def test_reliability_bars_carry_the_perfect_calibration_line() -> None:
    panel = _panel("Reliability by bin")
    bins = [t["legendFormat"] for t in panel["targets"]]
    series = [Series(b, [0.0], [0.5]) for b in bins]
    ax = _drawn(panel, series)
    (line,) = ax.lines
    middles = [sum(map(float, b.split("-"))) / 2 * 100 for b in bins]
    assert list(line.get_ydata()) == pytest.approx(middles)
    assert line.get_label() in [t.get_text() for t in ax.get_legend().get_texts()]
    assert ax.get_ylim()[1] > 100  # room for the value over a full bar


def test_heatmap_rows_are_the_quantity_and_ticks_clock_times() -> None:
    from dspark_obs.plotting import number_ticks

    series = [Series(f"{b}", [0.0, 90.0, 180.0], [1.0, 2.0, 3.0], float(b)) for b in (8, 16)]
    ax = _drawn(_panel("Batch size distribution"), series)
    assert ax.get_ylabel() == "batch size (bucket)"
    number_ticks(ax.figure)
    ax.figure.draw_without_rendering()
    ticks = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert ticks and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in ticks), ticks


def test_drawing_warns_nothing(tmp_path: Path) -> None:
    """The overview's time axes over 2.5-5 minutes once made matplotlib warn that no tick
    interval fits; every panel kind over such a span now draws silently."""
    import warnings

    from dspark_obs.dashboards.panel_plots import overview_png, panel_png

    datas = []
    for title in ("ECE by position", "Committed tokens/s", "Batch size distribution"):
        series = [
            Series(str(b), [t * 2.0 for t in range(100)], [1.0] * 100, float(b)) for b in (8, 16)
        ]
        datas.append(PanelData(_panel(title), series, span=(0.0, 200.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        overview_png(datas, tmp_path / "overview.png", "overview")
        for i, data in enumerate(datas):
            panel_png(data, tmp_path / f"{i}.png")


def test_stat_names_stay_in_their_columns_and_a_named_lone_value_keeps_its_name() -> None:
    from dspark_obs.plotting import new_figure

    names = [f"compact r0 @127.0.0.1:{port}" for port in (35161, 39245, 42635)]
    ax = new_figure(5.0, 4.0).add_subplot()  # as `panel_png` draws a narrow stat panel
    draw_panel(ax, PanelData(_panel("Refit R²"), _series(names, (0.9, 0.95))))
    ax.figure.draw_without_rendering()
    boxes = [t.get_window_extent() for t in ax.texts if t.get_gid() != "stat-value"]
    assert len(boxes) == 3
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
    panel = _panel("Utilisation")
    assert panel["options"]["textMode"] == "value_and_name"
    ax = _drawn(panel, _series(["known ceiling"], (0.9, 0.95)))
    assert "known ceiling" in [t.get_text() for t in ax.texts]
