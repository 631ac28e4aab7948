"""`dspark-obs dashboards render`: every panel drawn from a real Prometheus scraping `serve`."""

from __future__ import annotations

import html
from pathlib import Path

import pytest

pytest.importorskip("grafana_foundation_sdk")
pytest.importorskip("matplotlib")

import matplotlib.image
import numpy as np

from dspark_obs.dashboards import generate
from dspark_obs.dashboards.drawing import data_panels, slug
from dspark_obs.dashboards.querying import substitute, substitutions

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
