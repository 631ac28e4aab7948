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


def write_tree(directory: str | Path, texts: Mapping[str, str] | None = None) -> list[Path]:
    """Write each dashboard's JSON into DIR (`texts` by name of DASHBOARDS, by default the
    shipped copies) and DIR/provisioning/{dashboards,datasources}.yml."""
    root = Path(directory)
    (root / "provisioning").mkdir(parents=True, exist_ok=True)
    texts = texts or {}
    written = {
        **{root / file: texts.get(name) or shipped_json(name) for name, file in DASHBOARDS.items()},
        root / "provisioning" / "dashboards.yml": DASHBOARDS_YML,
        root / "provisioning" / "datasources.yml": DATASOURCES_YML,
    }
    for path, text in written.items():
        path.write_text(text, encoding="utf-8")
    return list(written)
