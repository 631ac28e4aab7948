"""The fleet dashboard: generated, committed, built from mergeable series only, and right.

Static: the committed JSON equals the generator's, survives grafana-foundation-sdk's model
types, lays out without overlaps, and no query reads a per-process ratio gauge (a check shown
to catch the main dashboard's averaged ECE). Live, against one Prometheus loading fleet.yml
and scraping two `serve` nodes (`cluster` east and west, two DP ranks each, their own traffic):
every query parses and returns data, and each fleet figure equals the same figure computed
here from the exporters' raw counters; every panel's range query, as the renderer runs it, holds
data its drawing code draws, and `render` rasterises one panel of each type.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest
import yaml

pytest.importorskip("grafana_foundation_sdk")

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from bench.sglang_load import polling_args
from dspark_obs.dashboards import definition
from dspark_obs.dashboards.drawing import data_panels, render, slug
from dspark_obs.dashboards.fleet_definition import FLEET_UID, generate, render_json
from dspark_obs.dashboards.panel_plots import draw_panel
from dspark_obs.dashboards.promql import CEILING, ESTIMATED, KNOWN
from dspark_obs.dashboards.provisioning import shipped_dashboard, shipped_json
from dspark_obs.dashboards.querying import Prometheus, fetch, substitutions
from dspark_obs.dashboards.querying import substitute as render_substitute
from dspark_obs.plotting import new_figure
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime_server import RuntimeFrontend
from exporters.catalog import CATALOG

from .prometheus_harness import PrometheusServer, prometheus_available
from .test_dashboards import substitute
from .test_serve_cli import Child

ROOT = Path(__file__).resolve().parents[1]
FLEET_RULES = ROOT / "deploy" / "rules" / "fleet.yml"
REGENERATE = "python -m dspark_obs.dashboards --write dashboards"
live = pytest.mark.skipif(not prometheus_available(), reason="needs prometheus (tools/test.sh)")


def exprs(d: dict) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in data_panels(d) for t in p["targets"]]


# -- static checks -------------------------------------------------------------------------


def test_committed_json_is_current_and_round_trips() -> None:
    text = render_json()
    assert (ROOT / "dashboards" / "dspark-fleet.json").read_text(encoding="utf-8") == text, (
        f"dashboards/dspark-fleet.json is stale; regenerate it with `{REGENERATE}`"
    )
    assert shipped_json("fleet") == text, f"the package's copy is stale: `{REGENERATE}`"
    d = generate()
    assert json.loads(json.dumps(Dashboard.from_json(d), cls=JSONEncoder)) == d
    assert d["uid"] == FLEET_UID != definition.DASHBOARD_UID


def test_layout_units_variables() -> None:
    d = generate()
    assert [p["title"] for p in d["panels"] if p["type"] == "row"] == [
        "Fleet",
        "Fleet by workload",
        "Per node",
        "Per rank",
    ]
    cells: dict[tuple[int, int], str] = {}
    for p in d["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        xs, ys = range(g["x"], g["x"] + g["w"]), range(g["y"], g["y"] + g["h"])
        for cell in ((x, y) for x in xs for y in ys):
            assert cell not in cells, f"{p['title']!r} overlaps {cells[cell]!r}"
            cells[cell] = p["title"]
    for p in data_panels(d):
        defaults = p["fieldConfig"]["defaults"]
        assert defaults.get("unit") and p.get("description") and p["targets"], p["title"]
        assert defaults["thresholds"]["steps"], p["title"]
        for t in p["targets"]:
            if "{{rank}}" in t["legendFormat"]:
                assert "{{instance}}" in t["legendFormat"], p["title"]
    fleet_stats = [p for p in data_panels(d) if p["gridPos"]["y"] < 10]
    assert {p["type"] for p in fleet_stats} == {"stat"} and len(fleet_stats) == 10
    variables = {v["name"]: v["query"] for v in d["templating"]["list"] if v["type"] == "query"}
    assert list(variables) == [
        "engine", "model_name", "cluster", "instance", "workload", "mode", "rank",
    ]  # fmt: skip
    assert all(q.startswith("label_values(") for q in variables.values())


def _mergeable_names() -> set[str]:
    """Counters, histogram parts and fleet.yml's node sums of them: what may be summed."""
    names = set()
    for m in CATALOG:
        if m.kind == "counter":
            names.add(m.name)
        elif m.kind == "histogram":
            names |= {f"{m.name}_sum", f"{m.name}_count", f"{m.name}_bucket"}
    node = yaml.safe_load(FLEET_RULES.read_text())["groups"][0]
    assert node["name"] == "dspark-fleet-node"
    for rule in node["rules"]:
        assert _series(rule["expr"]) <= names, rule
        names.add(rule["record"])
    return names


def _series(expr: str) -> set[str]:
    """The series names a query reads: `name{...}`, and every catalog name a
    `__name__=~"..."` matcher matches."""
    found = set(re.findall(r"([a-zA-Z_:][\w:]*)\s*\{", expr))
    for regex in re.findall(r'__name__=~"([^"]+)"', expr):
        matched = {m.name for m in CATALOG if re.fullmatch(regex, m.name)}
        assert matched, regex
        found |= matched
    return found


def _violations(expr: str, mergeable: set[str]) -> set[str]:
    bad = _series(expr) - mergeable
    if re.search(r"\bavg\b", expr):
        bad.add("avg")
    return bad


def test_every_query_reads_only_mergeable_series() -> None:
    mergeable = _mergeable_names()
    gauges = {m.name for m in CATALOG if m.kind == "gauge"}
    assert {"dspark_confidence_ece", "dspark_utilisation_ratio"} <= gauges
    assert not gauges & mergeable
    for title, expr in exprs(generate()):
        assert not _violations(expr, mergeable), (title, expr)
    # the check catches the main dashboard's per-process ECE gauge, averaged over ranks
    main = dict(exprs(definition.generate()))
    assert _violations(main["ECE by position"], mergeable) == {"dspark_confidence_ece", "avg"}


@pytest.mark.skipif(not prometheus_available(), reason="needs promtool (tools/test.sh)")
def test_every_query_parses(tmp_path: Path) -> None:
    """promtool parses each query as Prometheus would (one recording rule per query)."""
    rules = [
        {"record": f"panel:{i}", "expr": substitute(expr)}
        for i, (_, expr) in enumerate(exprs(generate()))
    ]
    path = tmp_path / "panels.yml"
    path.write_text(json.dumps({"groups": [{"name": "panels", "rules": rules}]}))
    proc = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(rules)} rules found" in proc.stdout


# -- against a real Prometheus --------------------------------------------------------------

NODES = (("east", "compact", 11, 10), ("west", "cap-accept", 23, 8))  # cluster, mode, seed, n
COUNTERS = (
    "dspark_request_steps_total",
    "dspark_confidence_bin_rows_total",
    "dspark_ceiling_tokens_count",
    "dspark_estimator_walk_point_tokens_total",
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Two nodes' `serve` and one Prometheus with fleet.yml; returns it once every record the
    ranks hold is scraped and summed, and the moment to query (traffic within the last 1m)."""
    from .test_federation import _drive, _records

    base = tmp_path_factory.mktemp("fleet")
    fronts, children, prom = [], [], None
    try:
        groups = []
        for cluster, mode, seed, _ in NODES:
            front = RuntimeFrontend(RuntimeConfig(mode=mode, seed=seed), port=0, dp_size=2)
            front.start()
            fronts.append(front)
            child = Child(
                *polling_args(front.url, poll_interval=0.2, out=base / cluster / "run"),
                "--no-clear",
                workdir=base / cluster / "child",
            )
            children.append(child)
            target = child.url().split("//")[1].split("/")[0]
            groups.append({"targets": [target], "labels": {"cluster": cluster}})
        prom = PrometheusServer(
            [{"job_name": "dspark", "static_configs": groups}],
            scrape_interval="1s",
            workdir=base / "prom",
            rule_files=[FLEET_RULES],
        )
        prom.start()
        prom.wait_until_up("dspark")
        # two rounds of traffic, the second once the first is recorded: rates need a rise
        # between two samples of every series
        for round_ in (0, 1):
            for front, (_, _, seed, n) in zip(fronts, NODES, strict=True):
                _drive([front], seed + round_, n // 2)
            if not round_:
                prom.wait_for(
                    "count by (cluster) (instance:dspark_request_steps:sum)",
                    lambda r: len(r) == len(NODES),
                )
        steps = {cluster: _records([f]) for f, (cluster, *_) in zip(fronts, NODES, strict=True)}
        prom.wait_for(
            "sum by (cluster) (dspark_steps_total)",
            lambda r: {x["metric"]["cluster"]: float(x["value"][1]) for x in r} == steps,
        )
        for name in COUNTERS:
            raw = prom.query_value(f"sum({name})")
            node = re.sub(r"^dspark_(.*?)(_total)?$", r"instance:dspark_\1:sum", name)
            prom.wait_for(f"sum({node})", lambda r, v=raw: bool(r) and float(r[0]["value"][1]) == v)
        yield prom, time.time()
    finally:
        if prom is not None:
            prom.stop()
        for child in children:
            child.kill()
        for front in fronts:
            front.stop()


@live
def test_every_panel_query_returns_data(fleet) -> None:
    prom, at = fleet
    for v in generate()["templating"]["list"]:
        if v["type"] == "query":
            found = re.fullmatch(r"label_values\(([\w:]+)(?:\{.*\})?, (\w+)\)", v["query"])
            metric, label = found.groups()
            values = {r["metric"].get(label) for r in prom.query(f"group by ({label}) ({metric})")}
            assert values - {None}, f"variable {v['name']} would have no values"
    empty = [
        f"{title}: {expr}"
        for title, expr in exprs(generate())
        if not prom.query(substitute(expr), at=at)
    ]
    assert not empty, "queries without data:\n" + "\n".join(empty)
    nodes = prom.query(
        substitute(_panel("Committed tokens/s by node")["targets"][0]["expr"]), at=at
    )
    assert {r["metric"]["cluster"] for r in nodes} == {"east", "west"}
    ranks = prom.query(
        substitute(_panel("Committed tokens/s by rank")["targets"][0]["expr"]), at=at
    )
    assert sorted((r["metric"]["cluster"], r["metric"]["rank"]) for r in ranks) == [
        ("east", "0"), ("east", "1"), ("west", "0"), ("west", "1"),
    ]  # fmt: skip


def _panel(title: str) -> dict:
    return next(p for p in data_panels(generate()) if p["title"] == title)


def _raw(prom: PrometheusServer, name: str, at: float, by: str | None = None):
    """The exporters' own counters (per rank): their total, or totals per value of `by`."""
    rows = prom.query(name, at=at)
    if by is None:
        return sum(float(r["value"][1]) for r in rows)
    out: dict[int, float] = {}
    for r in rows:
        k = int(r["metric"][by])
        out[k] = out.get(k, 0.0) + float(r["value"][1])
    keys = range(max(out) + 1)
    return np.array([out.get(k, 0.0) for k in keys])


@live
def test_fleet_figures_equal_the_raw_counters(fleet) -> None:
    """Every since-start fleet stat against numpy over the per-rank counters of both nodes."""
    prom, at = fleet

    def raw(name: str, by: str | None = None):
        return _raw(prom, name, at, by)

    rows, pos, pred = (
        raw(f"dspark_confidence_bin_{k}_total", "bin") for k in ("rows", "positives", "predicted")
    )
    neg = rows - pos
    walked = raw("dspark_estimator_resolved_blocks_total") + raw(
        "dspark_estimator_censored_blocks_total"
    )
    observed = raw("dspark_estimator_observed_ceiling_tokens_total")
    blocks = raw("dspark_estimator_observed_blocks_total") + walked
    want = {
        "Mean accepted": raw("dspark_accepted_tokens_sum") / raw("dspark_accepted_tokens_count"),
        "Mean window": raw("dspark_window_tokens_sum") / raw("dspark_window_tokens_count"),
        "Utilisation": 1 - raw("dspark_trim_loss_tokens_total") / raw("dspark_ceiling_tokens_sum"),
        "Mean ceiling": raw("dspark_ceiling_tokens_sum") / raw("dspark_ceiling_tokens_count"),
        "ECE": np.abs(pred - pos).sum() / rows.sum(),
        "Brier": (
            raw("dspark_confidence_predicted_squared_total")
            - 2 * raw("dspark_confidence_positive_predicted_total")
            + raw("dspark_confidence_positives_total")
        )
        / raw("dspark_confidence_labelled_total"),
        # pairs from the negatives' cumulative sum, not from the exported negatives_below
        "AUROC": (pos * (np.cumsum(neg) - 0.5 * neg)).sum() / (pos.sum() * neg.sum()),
    }
    assert rows.sum() > 0 and walked > 0 and raw("dspark_ceiling_tokens_count") > 0
    for title, value in want.items():
        (expr,) = [t["expr"] for t in _panel(title)["targets"]]
        got = prom.query(substitute(expr), at=at)
        assert len(got) == 1, (title, got)
        assert float(got[0]["value"][1]) == pytest.approx(value, rel=1e-9, abs=1e-12), title
        if title in ("Utilisation", "Mean ceiling"):  # west's cap-accept rows know it
            assert got[0]["metric"][CEILING] == KNOWN, title
    for target in _panel("Ceiling estimate")["targets"]:
        bound = target["legendFormat"]
        value = (observed + raw(f"dspark_estimator_walk_{bound}_tokens_total")) / blocks
        (got,) = prom.query(substitute(target["expr"]), at=at)
        assert float(got["value"][1]) == pytest.approx(value, rel=1e-9), bound
    bars = _panel("Reliability by bin")["targets"]
    for k, target in enumerate(bars):
        got = prom.query(substitute(target["expr"]), at=at)
        if rows[k] > 0:
            assert float(got[0]["value"][1]) == pytest.approx(pos[k] / rows[k], rel=1e-9)
        else:
            assert not got


@live
def test_without_a_known_ceiling_the_fleet_shows_the_walk_estimate(fleet) -> None:
    """East serves compact without a shadow twin, so no ceiling of its is known: alone, its
    utilisation and mean ceiling are the walk's estimate, so named, and equal to numpy over
    its per-rank counters; beside west, each node's own line says which it is."""
    prom, at = fleet

    def raw(name: str) -> float:
        return _raw(prom, f'{name}{{cluster="east"}}', at)

    assert raw("dspark_ceiling_tokens_count") == 0
    walked = raw("dspark_estimator_resolved_blocks_total") + raw(
        "dspark_estimator_censored_blocks_total"
    )
    ceiling = (
        raw("dspark_estimator_observed_ceiling_tokens_total")
        + raw("dspark_estimator_walk_point_tokens_total")
    ) / (raw("dspark_estimator_observed_blocks_total") + walked)
    accepted = raw("dspark_accepted_tokens_sum") / raw("dspark_request_steps_total")
    assert walked > 0 and 0 < accepted <= ceiling
    east = substitutions({"cluster": "east"}, step="15s", range_="5m")
    for title, value in (("Utilisation", accepted / ceiling), ("Mean ceiling", ceiling)):
        (target,) = _panel(title)["targets"]
        (got,) = prom.query(render_substitute(target["expr"], east), at=at)
        assert got["metric"][CEILING] == ESTIMATED, title
        assert float(got["value"][1]) == pytest.approx(value, rel=1e-9), title
    for title in ("Utilisation by node", "Utilisation by rank"):
        (target,) = _panel(title)["targets"]
        rows = prom.query(substitute(target["expr"]), at=at)
        shown = {(r["metric"]["cluster"], r["metric"][CEILING]) for r in rows}
        assert {c for c, _ in shown} == {"east", "west"}, title
        assert shown == {("east", ESTIMATED), ("west", KNOWN)}, title


def _one_panel_per_type(dashboard: dict) -> dict:
    """The dashboard with only the first data panel of each type: what the rasterised render
    needs to exercise every drawing path."""
    seen: set[str] = set()
    panels = []
    for p in data_panels(dashboard):
        if p["type"] not in seen:
            seen.add(p["type"])
            panels.append(p)
    return {**dashboard, "panels": panels}


@live
def test_every_panel_draws_from_its_range_query(fleet) -> None:
    """Each panel's series as the renderer fetches them (`query_range`, the variables
    substituted) hold data, and its drawing code runs on them. Drawn, not rasterised: the
    pixels are `test_render_fleet_dashboard`'s, one panel of each type."""
    prom, at = fleet
    client = Prometheus(prom.url, timeout=10.0)
    values = substitutions({"cluster": ".*"}, step="5s", range_="2m")
    empty = []
    for panel in data_panels(generate()):
        data = fetch(client, panel, values, (at - 120, at, 5.0))
        if not data.has_data:
            empty.append(panel["title"])
            continue
        ax = new_figure(4, 3).add_subplot()
        draw_panel(ax, data)
        assert ax.get_title() == panel["title"]
        drawn = ax.lines + ax.patches + ax.texts + ax.images + ax.collections
        assert drawn, f"{panel['title']}: nothing drawn"
    assert not empty, f"panels without data: {empty}"


@live
def test_render_fleet_dashboard(fleet, tmp_path: Path) -> None:
    """`render` of the fleet dashboard, one panel of each type: its files, its count of
    panels with data, and pixels that are not blank."""
    prom, _ = fleet
    out = tmp_path / "render"
    dashboard = _one_panel_per_type(shipped_dashboard("fleet"))
    result = render(
        prom.url, out, range_="2m", step="5s", variables={"cluster": ".*"}, dashboard=dashboard
    )
    panels = data_panels(dashboard)
    assert {p["type"] for p in panels} == {p["type"] for p in data_panels(generate())}
    pngs = sorted(out.glob("[0-9][0-9]-*.png"))
    assert [p.name for p in pngs] == [
        f"{i:02d}-{slug(p['title'])}.png" for i, p in enumerate(panels, start=1)
    ]
    assert [d.has_data for d, _ in result.panels] == [True] * len(panels)
    for png in [*pngs, result.overview]:
        pixels = matplotlib.image.imread(png)[..., :3]
        assert pixels.var() > 0 and not np.all(pixels >= 0.999), f"{png.name} is blank"
    page = result.index.read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') == len(panels) + 1
