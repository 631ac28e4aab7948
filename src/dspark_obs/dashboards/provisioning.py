"""The dashboards as files Grafana provisions: their JSON and the provisioning YAML beside it.

Kept apart from the dashboard's definition because it is about where Grafana finds the
dashboard and its data source, not about what the dashboard shows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from importlib.resources import files
from pathlib import Path
from typing import Any

from ..outputs import prepare_dir, write_file

DASHBOARDS_YML = """\
# Grafana file provisioning: copy to /etc/grafana/provisioning/dashboards/ and put
# dspark.json and dspark-fleet.json in the folder named by `path`.
apiVersion: 1
providers:
  - name: dspark
    orgId: 1
    folder: DSpark
    type: file
    disableDeletion: false
    allowUiUpdates: false
    updateIntervalSeconds: 60
    options:
      path: /var/lib/grafana/dashboards/dspark
      foldersFromFilesStructure: false
"""

DATASOURCES_YML = """\
# Grafana file provisioning: copy to /etc/grafana/provisioning/datasources/ and point `url`
# at the Prometheus that scrapes `dspark-obs serve`. The dashboard's "Data source" variable
# lists every Prometheus data source; this one is the default.
apiVersion: 1
datasources:
  - name: Prometheus
    type: prometheus
    uid: prometheus
    access: proxy
    url: http://localhost:9090
    isDefault: true
    jsonData:
      timeInterval: 15s
"""


#: the dashboards shipped, by the name `dashboards render --dashboard` and `push` take
DASHBOARDS = {"main": "dspark.json", "fleet": "dspark-fleet.json"}


def shipped_json(name: str = "main") -> str:
    """A generated dashboard shipped in the package (kept equal to its generator's output by
    tests/test_dashboards.py and tests/test_fleet_dashboard.py), read without
    grafana-foundation-sdk."""
    return (files(__package__) / DASHBOARDS[name]).read_text(encoding="utf-8")


def shipped_dashboard(name: str = "main") -> dict[str, Any]:
    return json.loads(shipped_json(name))


def dashboard_with_selector(text: str, selector: str, sglang: str = "") -> str:
    """A dashboard's JSON with `selectors.with_selector` in every panel query and variable."""
    from .selectors import with_selector

    d = json.loads(text)

    def visit(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    node[key] = with_selector(value, selector, sglang)
                else:
                    visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    visit(d)
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"


def write_tree(
    directory: str | Path,
    texts: Mapping[str, str] | None = None,
    *,
    selector: str = "",
    sglang_selector: str = "",
    runbook_base: str | None = None,
    rules: bool = True,
) -> list[Path]:
    """Write each dashboard's JSON into DIR (`texts` by name of DASHBOARDS, by default the
    shipped copies), DIR/provisioning/{dashboards,datasources}.yml, and the Prometheus rules
    into DIR/rules/ (`selectors.RULES`); `selector` (`sglang_selector` for SGLang's gauges)
    put into every query of both, and the alerts' runbook links at `runbook_base`."""
    from .selectors import RULES, rules_with_selector, shipped_rules

    root = prepare_dir(directory)
    prepare_dir(root / "provisioning", "--out's")
    texts = texts or {}
    dashboards = {name: texts.get(name) or shipped_json(name) for name in DASHBOARDS}
    if selector or sglang_selector:
        dashboards = {
            name: dashboard_with_selector(text, selector, sglang_selector)
            for name, text in dashboards.items()
        }
    written = {
        **{root / DASHBOARDS[name]: text for name, text in dashboards.items()},
        root / "provisioning" / "dashboards.yml": DASHBOARDS_YML,
        root / "provisioning" / "datasources.yml": DATASOURCES_YML,
    }
    if rules:
        prepare_dir(root / "rules", "--out's")
        for name in RULES:
            written[root / "rules" / name] = rules_with_selector(
                shipped_rules(name), selector, sglang_selector, runbook_base
            )
    for path, text in written.items():
        write_file(path, text)
    return list(written)
