"""Grafana dashboards for the dspark-obs exporter, generated with grafana-foundation-sdk.

`generate()` builds the main dashboard as a plain JSON dict; `write_tree(DIR)` writes the
generated copy shipped in the package (`dspark.json` here, so that exporting, rendering and
pushing need no SDK) with Grafana file-provisioning YAML. The committed copies live here and in
the top-level `dashboards/` folder; regenerate both with
`python -m dspark_obs.dashboards --write dashboards`.

`generate`, `render_json` and `DASHBOARD_UID` are looked up on first use: importing them pulls in
grafana-foundation-sdk, an optional extra that only regenerating the dashboard needs.
"""

from __future__ import annotations

from typing import Any

from .provisioning import shipped_dashboard, write_tree

__all__ = ["DASHBOARD_UID", "generate", "render_json", "shipped_dashboard", "write_tree"]


def __getattr__(name: str) -> Any:
    if name in ("DASHBOARD_UID", "generate", "render_json"):
        from . import definition

        return getattr(definition, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
