"""The Grafana dashboard: generated, committed, structurally sound, and every query has data.

No Grafana binary can be installed here, so Grafana itself never loads the dashboard in these
tests. Instead: the committed JSON must equal the generator's output, it must survive a round
trip through grafana-foundation-sdk's model types (`Dashboard.from_json`), its layout must be
valid, `push` is checked against a stdlib HTTP server that enforces Grafana's documented
dashboard API, and every panel query runs against a real Prometheus scraping `dspark-obs serve`.
"""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("grafana_foundation_sdk")
pytest.importorskip("grafana_client")

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from dspark_obs.cli.main import main as cli_main
from dspark_obs.dashboards import DASHBOARD_UID, fleet_definition, generate, render_json
from dspark_obs.dashboards.promql import CEILING, ESTIMATED, KNOWN, WALK_BLOCKS, WALK_TOKENS
from dspark_obs.dashboards.provisioning import dashboard_with_selector, shipped_json
from dspark_obs.dashboards.querying import RATE_INTERVAL, substitutions
from dspark_obs.dashboards.querying import substitute as render_substitute
from dspark_obs.dashboards.values import format_value

from .live_exporter import serve_scraped, start_scraped
from .prometheus_harness import WAIT, PrometheusServer, prometheus_available

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "dashboards" / "dspark.json"
REGENERATE = "python -m dspark_obs.dashboards --write dashboards"


def panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in d["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])  # collapsed rows nest their panels
    return out


def data_panels(d: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in panels(d) if p["type"] != "row"]


# -- static checks -------------------------------------------------------------------------


def test_committed_json_is_current() -> None:
    assert COMMITTED.exists(), f"dashboards/dspark.json missing; run `{REGENERATE}`"
    assert COMMITTED.read_text(encoding="utf-8") == render_json(), (
        f"dashboards/dspark.json is stale; regenerate it with `{REGENERATE}`"
    )
    assert shipped_json() == render_json(), (
        f"src/dspark_obs/dashboards/dspark.json is stale; regenerate it with `{REGENERATE}`"
    )
    for name in ("dashboards.yml", "datasources.yml"):
        assert (ROOT / "dashboards" / "provisioning" / name).exists(), REGENERATE


def test_round_trips_through_sdk_models() -> None:
    d = generate()
    model = Dashboard.from_json(d)
    again = json.loads(json.dumps(model, cls=JSONEncoder))
    assert again == d
    assert model.uid == DASHBOARD_UID
    assert model.title == "DSpark — acceptance and ceiling"


def test_layout_ids_units_descriptions() -> None:
    d = generate()
    ids = [p["id"] for p in panels(d)]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    cells: dict[tuple[int, int], str] = {}
    for p in panels(d):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == [
        "Overview",
        "Per workload",
        "Cost of trimming",
        "Load",
        "Calibration",
        "Cost model",
        "Estimator health",
        "Sources",
        "Held against SGLang",
        "Held against vLLM",
    ]
    kinds = {p["type"] for p in data_panels(d)}
    assert {"timeseries", "stat", "bargauge", "heatmap"} <= kinds
    for p in data_panels(d):
        defaults = p["fieldConfig"]["defaults"]
        assert defaults.get("unit"), f"{p['title']!r} has no unit"
        assert p.get("description"), f"{p['title']!r} has no description"
        assert defaults.get("thresholds", {}).get("steps"), f"{p['title']!r} has no thresholds"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert p["targets"], f"{p['title']!r} has no queries"
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    for name in ("engine", "model_name", "workload", "rank", "mode", "instance"):
        assert variables[name]["type"] == "query"
        assert "label_values(dspark_request_steps_total" in variables[name]["query"]


#: Families with no series for a documented reason (docs/metrics.md, docs/dashboards.md), as
#: a pattern over a query's selectors (`name{...}`), and the words a panel that reads only
#: them must say in its noValue; None: no words will do, the panel must fall back.
REASONS: dict[str, tuple[re.Pattern[str], str | None]] = {
    # known only on static and cap-accept rows and from a shadow twin; the walk estimate
    # stands in for it (compact, no shadow: serve as first started)
    "ceiling": (
        re.compile(
            r"dspark_(ceiling_tokens|trim_loss_tokens|utilisation|ceiling_mean_tokens)"
            r"|instance:dspark_(ceiling_tokens|trim_loss_tokens)"
        ),
        None,
    ),
    "confidence": (re.compile(r"dspark_confidence_"), "drafter confidence"),
    "step times": (
        re.compile(r"dspark_(cost_model_(?!refit)|step_(predicted|measured)_seconds)"),
        "measured step time",
    ),
    "refit": (re.compile(r"dspark_cost_model_refit_"), "no refit yet"),
    "priced steps": (re.compile(r"dspark_trim_(committed|step|static)"), "cost table"),
    "sglang": (re.compile(r'sglang\[|engine="sglang"'), "--enable-metrics"),
    "vllm": (re.compile(r'vllm\[|engine="vllm"'), "vLLM's own /metrics"),
    "source state": (re.compile(r"dspark_source_up"), "reports its state"),
}
#: per dashboard: every query reads series that may be absent from a data source
DASHBOARD_REASONS = {
    "main": {"scrape": (re.compile(r"dspark_"), "no dspark-obs series match")},
    "fleet": {
        "node sums": (re.compile(r"^instance:dspark_"), "fleet.yml"),
        "rank counters": (re.compile(r"^dspark_"), "node's own Prometheus"),
    },
}
_SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)?\{[^}]*\}")
_OR = re.compile(r"\bor\b(\s+(on|ignoring)\s*\([^)]*\))?")


def branches(expr: str) -> list[str]:
    """The alternatives of a query: its top-level `or` operands, each one's own `or`s split
    again where it is a parenthesised whole (`a or on (x) (b or c)` is a, b and c)."""
    parts, depth, start, quoted = [], 0, 0, False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == '"' and expr[i - 1] != "\\":
            quoted = not quoted
        elif not quoted and c == "(":
            depth += 1
        elif not quoted and c == ")":
            depth -= 1
        elif not quoted and depth == 0 and (m := _OR.match(expr, i)) and expr[i - 1] == " ":
            parts.append(expr[start:i])
            start = i = m.end()
            continue
        i += 1
    parts.append(expr[start:])
    out = []
    for part in (p.strip() for p in parts):
        inner = part[1:-1] if part.startswith("(") and _closes_at_end(part) else None
        out.extend(branches(inner) if inner is not None and len(parts) > 1 else [part])
    return out


def _closes_at_end(text: str) -> bool:
    depth = 0
    for i, c in enumerate(text):
        depth += c == "("
        depth -= c == ")"
        if depth == 0:
            return i == len(text) - 1
    return False


def _reads(branch: str, pattern: re.Pattern[str]) -> bool:
    return any(pattern.search(m.group(0)) for m in _SELECTOR.finditer(branch))


def empty_under(expr: str, reason: str, reasons=REASONS) -> bool:
    """Whether a query has no series when `reason` holds: each of its alternatives reads a
    family that has none then."""
    pattern = reasons[reason][0]
    return all(_reads(b, pattern) for b in branches(expr))


@pytest.mark.parametrize("which", ["main", "fleet"])
def test_every_panel_that_can_be_empty_falls_back_or_says_why(which: str) -> None:
    """A panel empty for a documented reason shows a fallback or says the reason in its
    place (Grafana's noValue) and in its description; the ceiling's panels fall back to the
    walk's estimate and name the ceiling each series rests on."""
    d = generate() if which == "main" else fleet_definition.generate()
    reasons = {**REASONS, **DASHBOARD_REASONS[which]}
    fallbacks = []
    for p in data_panels(d):
        said = p["fieldConfig"]["defaults"].get("noValue") or ""
        assert said.startswith("No data: ") and p["description"].endswith(f"{said}."), p["title"]
        exprs = [t["expr"] for t in p["targets"]]
        for reason, (_, words) in reasons.items():
            if all(empty_under(e, reason, reasons) for e in exprs):
                assert words is not None, f"{p['title']!r} is empty without {reason}: fall back"
                assert words in said, f"{p['title']!r} can be empty ({reason}) and says {said!r}"
        for t in p["targets"]:
            if f'"{ESTIMATED}"' in t["expr"]:
                fallbacks.append(p["title"])
                assert f'"{KNOWN}"' in t["expr"] and "{{ceiling}}" in t["legendFormat"]
                assert ESTIMATED in p["description"], p["title"]
                if p["type"] == "stat":  # a lone value is named only so
                    assert p["options"]["textMode"] == "value_and_name", p["title"]
                known, estimated = branches(t["expr"])
                assert empty_under(known, "ceiling") and not empty_under(estimated, "ceiling")
    want = {
        "main": CEILING_PANELS,
        "fleet": (
            *("Utilisation", "Mean ceiling", "Utilisation by workload"),
            *("Utilisation by node", "Utilisation by rank"),
        ),
    }
    assert sorted(fallbacks) == sorted(want[which])


def test_branches_of_a_query() -> None:
    assert branches('a{x="or"} or ignoring (c) (b / c)') == ['a{x="or"}', "b / c"]
    assert branches("sum (a) or on (s) (b * 0 or c * 0)") == ["sum (a)", "b * 0", "c * 0"]
    assert branches("sum (rate(error[1m]))") == ["sum (rate(error[1m]))"]


def test_stats_write_counts_with_thousands_separators() -> None:
    """A stat shows a count or a rate of many with separators (`locale`), never `12345`
    nor a `12.3 K` that hides digits; the other stats are ratios, seconds and a few tokens."""
    for d in (generate(), fleet_definition.generate()):
        for p in data_panels(d):
            if p["type"] == "stat":
                unit = p["fieldConfig"]["defaults"]["unit"]
                assert unit in ("locale", "percentunit", "s", "none", "suffix: tok"), p["title"]
    panel = {"fieldConfig": {"defaults": {"unit": "locale", "decimals": 0}}}
    assert format_value(10432.4, panel) == "10,432"
    assert format_value(-1234.5, panel) == "-1,235"  # ties away from zero, as ICU
    assert format_value(float("nan"), panel) == "No data"
    panel["fieldConfig"]["defaults"]["decimals"] = 2
    assert [format_value(v, panel) for v in (1234.5, 1234.0, 1.005, 0.125, -0.001)] == [
        "1,234.5", "1,234", "1.01", "0.13", "0",
    ]  # fmt: skip
    del panel["fieldConfig"]["defaults"]["decimals"]  # toLocaleString's own 3 at most
    assert format_value(1234567.891234, panel) == "1,234,567.891"


def test_export_writes_json_and_provisioning(tmp_path: Path) -> None:
    assert cli_main(["dashboards", "export", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert json.loads((out / "dspark.json").read_text()) == generate()
    assert "providers:" in (out / "provisioning" / "dashboards.yml").read_text()
    assert "type: prometheus" in (out / "provisioning" / "datasources.yml").read_text()
    (tmp_path / "file").write_text("x")
    assert cli_main(["dashboards", "export", str(tmp_path / "file")]) == 2


# -- push against a stand-in for Grafana's HTTP API -------------------------------------------


class FakeGrafana(BaseHTTPRequestHandler):
    """Enforces the documented contract of Grafana's dashboard and folder APIs.

    POST /api/dashboards/db with `Authorization: Bearer <token>` and a JSON body holding
    `dashboard` (with uid and title), `overwrite` and `folderUid` (or the legacy `folderId`);
    GET/POST /api/folders to find or create the folder. Anything else is a 4xx.
    """

    token = "glsa_test"
    requests: list[tuple[str, str, dict[str, str], Any]]
    folders: list[dict[str, Any]]

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, code: int, body: Any) -> None:
        raw = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.requests.append((method, self.path, dict(self.headers), body))
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._reply(401, {"message": "Unauthorized"})
        if method == "GET" and self.path.split("?")[0] == "/api/folders":
            return self._reply(200, self.folders)
        if method == "POST" and self.path == "/api/folders":
            folder = {"id": len(self.folders) + 1, "uid": f"f{len(self.folders) + 1}"}
            self.folders.append({**folder, "title": body["title"]})
            return self._reply(200, {**folder, "title": body["title"]})
        if method == "POST" and self.path == "/api/dashboards/db":
            if self.headers.get_content_type() != "application/json":
                return self._reply(415, {"message": "bad content type"})
            dash = body.get("dashboard") if isinstance(body, dict) else None
            if not isinstance(dash, dict) or not dash.get("uid") or not dash.get("title"):
                return self._reply(400, {"message": "bad dashboard"})
            if body.get("overwrite") is not True:
                return self._reply(412, {"message": "version-mismatch"})
            folder = body.get("folderUid", body.get("folderId", ""))
            if folder not in ("", 0) and folder not in {f["uid"] for f in self.folders} | {
                f["id"] for f in self.folders
            }:
                return self._reply(400, {"message": "folder not found"})
            uid = dash["uid"]
            return self._reply(
                200,
                {"id": 1, "uid": uid, "url": f"/d/{uid}/x", "status": "success", "version": 1},
            )
        return self._reply(404, {"message": "Not found"})

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")


@pytest.fixture
def grafana(monkeypatch: pytest.MonkeyPatch):
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    handler = type("Handler", (FakeGrafana,), {"requests": [], "folders": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_push_follows_grafana_dashboard_api(grafana, tmp_path: Path, capsys) -> None:
    url, handler = grafana
    token = tmp_path / "token"
    token.write_text(handler.token + "\n")
    argv = ["dashboards", "push", "--grafana-url", url, "--token-file", str(token)]
    assert cli_main([*argv, "--folder", "DSpark"]) == 0
    posts = [r for r in handler.requests if r[0] == "POST" and r[1] == "/api/dashboards/db"]
    assert len(posts) == 1
    _, _, headers, body = posts[0]
    assert headers["Authorization"] == f"Bearer {handler.token}"
    assert body["overwrite"] is True
    assert body["folderUid"] == "f1"
    assert body["dashboard"]["uid"] == DASHBOARD_UID
    assert body["dashboard"]["id"] is None
    assert body["dashboard"]["panels"] == generate()["panels"]
    assert f"/d/{DASHBOARD_UID}" in capsys.readouterr().out

    # the folder exists now: found, not created again
    assert cli_main([*argv, "--folder", "DSpark"]) == 0
    assert [r[1] for r in handler.requests if r[0] == "POST"].count("/api/folders") == 1


def test_push_errors_are_one_line_exit_2(grafana, tmp_path: Path, monkeypatch, capsys) -> None:
    url, _ = grafana
    base = ["dashboards", "push", "--grafana-url", url]
    assert cli_main(base) == 2  # no token at all
    assert "GRAFANA_TOKEN" in capsys.readouterr().err
    assert cli_main([*base, "--token-file", str(tmp_path / "missing")]) == 2
    assert "cannot read --token-file" in capsys.readouterr().err
    monkeypatch.setenv("GRAFANA_TOKEN", "wrong")
    assert cli_main(base) == 2
    err = capsys.readouterr().err
    assert "HTTP 401" in err and err.count("\n") == 1
    assert cli_main(["dashboards", "push", "--grafana-url", "ftp://x"]) == 2
    free = ThreadingHTTPServer(("127.0.0.1", 0), FakeGrafana)
    port = free.server_address[1]
    free.server_close()
    assert cli_main(["dashboards", "push", "--grafana-url", f"http://127.0.0.1:{port}"]) == 2
    assert "cannot reach Grafana" in capsys.readouterr().err


# -- every query against a real Prometheus ---------------------------------------------------


def substitute(expr: str) -> str:
    """The renderer's substitution (every query variable `.*`), checked to leave no `$`."""
    out = render_substitute(expr, substitutions(step="15s", range_="5m"))
    assert "$" not in out, f"unsubstituted variable in {out!r}"
    return out


SGLANG_CHECK_PANELS = ("Ours and SGLang's, per request-step", "Disagreement with SGLang")
#: the "Held against vLLM" row needs a vLLM server's own counters beside series of engine
#: vllm (deploy/rules/tests/vllm_check_test.yml holds the same figures in its rules)
VLLM_CHECK_PANELS = ("Ours and vLLM's", "Disagreement with vLLM")
#: the panels that read the ceiling, which `serve` as first started (compact, no shadow
#: twin) never observes: the review that found them showing "No data"
CEILING_PANELS = (
    "Utilisation",
    "Trim loss per request-step",
    "Utilisation (last N steps)",
    "Utilisation by workload",
)
live = pytest.mark.skipif(not prometheus_available(), reason="needs prometheus (tools/test.sh)")


def _default_serve(workdir: Path, request: pytest.FixtureRequest) -> PrometheusServer:
    """`serve` as a new user first starts it: the runtime in compact mode, no shadow twin
    (so no ceiling is ever observed), fast and small as `serve_scraped` runs it."""
    prom = start_scraped(workdir, request)
    # rate() needs two samples of every counter, walks must have ended, and the sliding
    # estimate be published: the fallback's own inputs are the proof
    prom.wait_for(
        "count(rate(dspark_estimator_resolved_blocks_total[1m]) > 0)"
        ' and count(dspark_ceiling_estimate_tokens{source="walk"})',
        lambda r: bool(r),
    )
    return prom


@pytest.fixture(scope="module")
def default_serve(tmp_path_factory, request) -> PrometheusServer:
    return _default_serve(tmp_path_factory.mktemp("default-serve"), request)


@pytest.fixture(scope="module")
def shadow_serve(tmp_path_factory, request) -> PrometheusServer:
    return serve_scraped(tmp_path_factory.mktemp("shadow-serve"), request)


@live
@pytest.mark.parametrize(
    "served, selector",
    [("default_serve", ""), ("shadow_serve", 'job="dspark"')],
    ids=["default-serve-as-shipped", "shadow-with-selector"],
)
def test_every_panel_query_returns_data(
    request: pytest.FixtureRequest, served: str, selector: str
) -> None:
    """As shipped on `serve` as first started (no shadow twin), and as `dashboards export
    --selector` writes it on a serve with a shadow twin (the scrape job here is `dspark`):
    every variable has values and every panel data. With the shadow every query has data,
    and the ceiling's panels show the known ceiling; without it they show the walk's
    estimate, so named, and only a known-ceiling series drawn beside an estimate is empty."""
    prom = request.getfixturevalue(served)
    shadow = served == "shadow_serve"
    dashboard = json.loads(dashboard_with_selector(render_json(), selector))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    for name in ("engine", "model_name", "instance", "workload", "mode", "rank"):
        series, label = re.fullmatch(
            r"label_values\((\w+(?:\{.*\})?), (\w+)\)", variables[name]["query"]
        ).groups()
        query = f"group by ({label}) ({substitute(series)})"
        values = {r["metric"].get(label) for r in prom.query(query)}
        assert values - {None}, f"variable {name} would have no values"

    deadline = time.monotonic() + WAIT
    # the "Held against SGLang" row needs an SGLang server's own metrics beside series of
    # engine sglang: tests/test_sglang_check.py runs its queries on those
    checked = [
        p for p in data_panels(dashboard)
        if p["title"] not in SGLANG_CHECK_PANELS + VLLM_CHECK_PANELS
    ]  # fmt: skip
    while True:
        empty, blank, ceilings = [], [], {}
        for p in checked:
            answers = [(t, prom.query(substitute(t["expr"]))) for t in p["targets"]]
            if not any(rows for _, rows in answers):
                blank.append(p["title"])
            for t, rows in answers:
                expr = substitute(t["expr"])
                if not rows and (shadow or not empty_under(t["expr"], "ceiling")):
                    empty.append(f"{p['title']} [{t['refId']}]: {expr}")
                if p["title"] in CEILING_PANELS:
                    ceilings[p["title"]] = {r["metric"].get(CEILING) for r in rows}
        if not (empty or blank) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not blank, f"panels without data: {blank}"
    assert not empty, "queries without data:\n" + "\n".join(empty)
    source = KNOWN if shadow else ESTIMATED
    assert ceilings == {title: {source} for title in CEILING_PANELS}, ceilings
    if shadow:  # the estimate the known ceiling hides here comes close to it
        (target,) = next(p for p in checked if p["title"] == "Utilisation")["targets"]
        known, estimated = (
            float(prom.query_value(b)) for b in branches(substitute(target["expr"]))
        )
        assert estimated == pytest.approx(known, abs=0.05)


def _rates(prom: PrometheusServer, name: str, at: float, by: str = "") -> dict[str, float]:
    """Each series' rate over the renderer's rate interval, summed here per value of `by`."""
    out: dict[str, float] = {}
    for r in prom.query(f"rate({name}[{RATE_INTERVAL}])", at=at):
        key = r["metric"].get(by, "") if by else ""
        out[key] = out.get(key, 0.0) + float(r["value"][1])
    return out


def _panel_values(prom, title: str, at: float, key) -> dict:
    (target,) = _panel(title)["targets"]
    rows = prom.query(substitute(target["expr"]), at=at)
    assert rows and all(r["metric"][CEILING] == ESTIMATED for r in rows), (title, rows)
    out = {key(r["metric"]): float(r["value"][1]) for r in rows}
    assert len(out) == len(rows), (title, rows)
    return out


@live
def test_ceiling_panels_fall_back_to_the_walk_estimate(default_serve) -> None:
    """Without a shadow twin the four ceiling panels show the walk's estimate: mean accepted
    over observed ceilings and the ended walks' point estimates per observed block and
    ended walk, recomputed here from each counter's rate (or, over the last N steps, from
    the exporter's two sliding gauges), series by series."""
    prom = default_serve
    at = time.time()
    # every scrape up to `at` is in once one after it is: the queries at `at` are then final
    prom.wait_for('timestamp(up{job="dspark"})', lambda r: bool(r) and float(r[0]["value"][1]) > at)
    for by in ("", "workload"):

        def rate(name: str, by: str = by) -> dict[str, float]:
            return _rates(prom, name, at, by)

        accepted = {k: v / rate("dspark_accepted_tokens_count")[k] for k, v in
                    rate("dspark_accepted_tokens_sum").items()}  # fmt: skip
        tokens = [rate(name) for name in WALK_TOKENS]
        blocks = [rate(name) for name in WALK_BLOCKS]
        ceiling = {k: sum(t[k] for t in tokens) / sum(b[k] for b in blocks) for k in accepted}
        assert all(0 < accepted[k] <= ceiling[k] for k in accepted), (accepted, ceiling)
        utilisation = {k: accepted[k] / ceiling[k] for k in accepted}
        if by:
            got = _panel_values(prom, "Utilisation by workload", at, lambda m: m["workload"])
            assert got == pytest.approx(utilisation, rel=1e-9)
            assert len(got) > 1
        else:
            got = _panel_values(prom, "Utilisation", at, lambda m: "")
            assert got == pytest.approx(utilisation, rel=1e-9)
            got = _panel_values(prom, "Trim loss per request-step", at, lambda m: "")
            assert got == pytest.approx({"": ceiling[""] - accepted[""]}, rel=1e-9)

    def series(name: str) -> dict[tuple, float]:
        keys = ("instance", "workload", "mode", "rank")
        rows = prom.query(name, at=at)
        return {tuple(r["metric"][k] for k in keys): float(r["value"][1]) for r in rows}

    accepted = series("dspark_accepted_mean_tokens")
    estimate = series('dspark_ceiling_estimate_tokens{source="walk"}')
    assert accepted.keys() == estimate.keys()
    got = _panel_values(
        prom,
        "Utilisation (last N steps)",
        at,
        lambda m: (m["instance"], m["workload"], m["mode"], m["rank"]),
    )
    assert got == pytest.approx({k: accepted[k] / estimate[k] for k in accepted}, rel=1e-12)


def _panel(title: str) -> dict:
    return next(p for p in data_panels(generate()) if p["title"] == title)
