"""What the CLI tells a user where the first hour used to go wrong: set-up, busy ports,
unreachable or misconfigured servers, dropped steps, ingested runs in summaries and compares.

Each case runs the real `dspark-obs` in a subprocess and checks the message and exit status.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_dashboards_export_writes_the_committed_json_without_the_grafana_sdk(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / "grafana_foundation_sdk.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(blocked)}
    out = tmp_path / "dash"
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", "dashboards", "export", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    committed = (ROOT / "dashboards" / "dspark.json").read_text(encoding="utf-8")
    assert (out / "dspark.json").read_text(encoding="utf-8") == committed
    assert str(out / "provisioning" / "datasources.yml") in proc.stdout.splitlines()
