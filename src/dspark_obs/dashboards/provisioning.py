"""The dashboard as files Grafana provisions: its JSON and the provisioning YAML beside it.

Kept apart from the dashboard's definition because it is about where Grafana finds the
dashboard and its data source, not about what the dashboard shows.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path
from typing import Any

DASHBOARDS_YML = """\
# Grafana file provisioning: copy to /etc/grafana/provisioning/dashboards/ and put
# dspark.json in the folder named by `path`.
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


def shipped_json() -> str:
    """The generated dashboard shipped in the package (kept equal to `render_json()` by
    tests/test_dashboards.py), read without grafana-foundation-sdk."""
    return (files(__package__) / "dspark.json").read_text(encoding="utf-8")


def shipped_dashboard() -> dict[str, Any]:
    return json.loads(shipped_json())


def write_tree(directory: str | Path, dashboard_json: str | None = None) -> list[Path]:
    """Write DIR/dspark.json (`dashboard_json`, by default the shipped copy) and
    DIR/provisioning/{dashboards,datasources}.yml."""
    root = Path(directory)
    (root / "provisioning").mkdir(parents=True, exist_ok=True)
    written = {
        root / "dspark.json": shipped_json() if dashboard_json is None else dashboard_json,
        root / "provisioning" / "dashboards.yml": DASHBOARDS_YML,
        root / "provisioning" / "datasources.yml": DATASOURCES_YML,
    }
    for path, text in written.items():
        path.write_text(text, encoding="utf-8")
    return list(written)
