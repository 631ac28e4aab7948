"""deploy/: the example Prometheus config, recording rules and alerts, checked by real promtool.

`promtool check config` validates the scrape config (and loads the rule files it names),
`promtool check rules` the rule syntax and PromQL, and `promtool test rules` runs the rule unit
tests in deploy/rules/tests/ (every alert fires once and stays silent once; recording rules have
exact values). Skipped without promtool on a workstation; a failure under CI, where
tools/test.sh installs it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from .prometheus_harness import require_prometheus

require_prometheus(promtool_only=True)

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
RULES = sorted((DEPLOY / "rules").glob("*.yml"))
RULE_TESTS = sorted((DEPLOY / "rules" / "tests").glob("*.yml"))


def _promtool(*args: str | Path, cwd: Path = DEPLOY) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["promtool", *(str(a) for a in args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, (
        f"promtool {' '.join(map(str, args))} exited {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )
    return proc


def test_files_present() -> None:
    assert [p.name for p in RULES] == ["alerts.yml", "fleet.yml", "recording.yml"]
    assert {p.name for p in RULE_TESTS} >= {
        "alerts_test.yml",
        "fleet_test.yml",
        "recording_test.yml",
    }
    targets = json.loads((DEPLOY / "targets" / "dspark.json").read_text())
    assert targets and all(group["targets"] for group in targets)


def test_check_config() -> None:
    out = _promtool("check", "config", "prometheus.yml")
    # The config's rule_files resolve (relative to the config) and are checked along with it.
    assert "3 rule files found" in out.stdout + out.stderr


def test_check_rules() -> None:
    _promtool("check", "rules", *RULES)


def test_rule_unit_tests() -> None:
    _promtool("test", "rules", *RULE_TESTS, cwd=DEPLOY / "rules" / "tests")


def test_every_alert_is_unit_tested() -> None:
    """Each alert is named in a rule test, firing (exp_labels) and silent (exp_alerts: [])."""
    alerts = [
        line.split(":", 1)[1].strip()
        for line in (DEPLOY / "rules" / "alerts.yml").read_text().splitlines()
        if line.strip().startswith("- alert:")
    ]
    assert len(alerts) >= 6
    text = "\n".join(path.read_text() for path in RULE_TESTS)
    for alert in alerts:
        cases = _cases(text, alert)
        assert cases, f"{alert} has no unit test"
        assert any("exp_alerts: []" in c for c in cases), f"{alert}: no silent case"
        assert any("exp_labels:" in c for c in cases), f"{alert}: no firing case"


def _cases(text: str, alert: str) -> list[str]:
    """The alert_rule_test entries (from one `- eval_time:` to the next) for one alert."""
    bodies = (chunk.split("\n  - interval:")[0] for chunk in text.split("- eval_time:")[1:])
    return [body for body in bodies if f"alertname: {alert}\n" in body]
