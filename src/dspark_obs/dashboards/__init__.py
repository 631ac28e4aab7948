"""Grafana dashboards for the dspark-obs exporter, generated with grafana-foundation-sdk.

`generate()` builds the main dashboard as a plain JSON dict; `write_tree(DIR)` writes it with
Grafana file-provisioning YAML. The committed copy lives in the top-level `dashboards/` folder;
regenerate it with `python -m dspark_obs.dashboards --write dashboards`.
"""

from .definition import DASHBOARD_UID, generate, render_json
from .provisioning import write_tree

__all__ = ["DASHBOARD_UID", "generate", "render_json", "write_tree"]
