"""The dashboard as files Grafana provisions: its JSON and the provisioning YAML beside it.

Kept apart from the dashboard's definition because it is about where Grafana finds the
dashboard and its data source, not about what the dashboard shows.
"""

from __future__ import annotations

from pathlib import Path

from .definition import render_json

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


def write_tree(directory: str | Path) -> list[Path]:
    """Write DIR/dspark.json and DIR/provisioning/{dashboards,datasources}.yml."""
    root = Path(directory)
    (root / "provisioning").mkdir(parents=True, exist_ok=True)
    files = {
        root / "dspark.json": render_json(),
        root / "provisioning" / "dashboards.yml": DASHBOARDS_YML,
        root / "provisioning" / "datasources.yml": DATASOURCES_YML,
    }
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return list(files)
