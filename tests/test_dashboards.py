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
from dspark_obs.dashboards import DASHBOARD_UID, generate, render_json
from dspark_obs.dashboards.provisioning import dashboard_with_selector, shipped_json
from dspark_obs.dashboards.querying import substitute as render_substitute
from dspark_obs.dashboards.querying import substitutions

from .live_exporter import serve_scraped
from .prometheus_harness import WAIT, prometheus_available

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


@pytest.mark.skipif(not prometheus_available(), reason="needs prometheus (tools/test.sh)")
@pytest.mark.parametrize("selector", ["", 'job="dspark"'], ids=["as-shipped", "with-selector"])
def test_every_panel_query_returns_data(
    tmp_path: Path, request: pytest.FixtureRequest, selector: str
) -> None:
    """As shipped, and as `dashboards export --selector` writes it (the scrape job here is
    `dspark`): every variable has values and every query data."""
    prom = serve_scraped(tmp_path, request)
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
    checked = [p for p in data_panels(dashboard) if p["title"] not in SGLANG_CHECK_PANELS]
    while True:
        empty = []
        for p in checked:
            for t in p["targets"]:
                expr = substitute(t["expr"])
                if not prom.query(expr):
                    empty.append(f"{p['title']} [{t['refId']}]: {expr}")
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not empty, "queries without data:\n" + "\n".join(empty)
