"""deploy/: the example Prometheus config, recording rules and alerts, checked by real promtool.

`promtool check config` validates the scrape config (and loads the rule files it names),
`promtool check rules` the rule syntax and PromQL, and `promtool test rules` runs the rule unit
tests in deploy/rules/tests/ (every alert fires once and stays silent once; recording rules have
exact values). Skipped without promtool on a workstation; a failure under CI, where
tools/test.sh installs it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_obs.dashboards.selectors import RULES as RULES_SHIPPED
from dspark_obs.dashboards.selectors import shipped_rules

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


# -- the mixin conventions: one selector for every query, a runbook for every alert --------


def test_the_package_ships_the_rules_of_deploy() -> None:
    """`dashboards export` writes the rules the package carries: deploy/rules' (kept equal by
    `python -m dspark_obs.dashboards --write dashboards`)."""
    for name in RULES_SHIPPED:
        assert shipped_rules(name) == (DEPLOY / "rules" / name).read_text(), name


def test_every_alert_links_its_runbook() -> None:
    text = (DEPLOY / "rules" / "alerts.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)", text)
    links = re.findall(r"runbook_url: docs/runbooks\.md#(\w+)", text)
    assert links == [a.lower() for a in alerts]
    runbooks = (DEPLOY.parent / "docs" / "runbooks.md").read_text()
    headings = {h.lower() for h in re.findall(r"^## (\w+)$", runbooks, re.M)}
    assert set(links) <= headings


@pytest.mark.parametrize("selector, fires", [('job=~"dspark.*"', True), ('job="elsewhere"', False)])
def test_exported_rules_select_what_the_selector_says(tmp_path, selector, fires) -> None:
    """The rules as `dashboards export --selector` writes them: clean for promtool, and the
    rule tests (their series' jobs are dspark and dspark-fleet) pass with a selector that
    keeps them;
    with one that keeps none, the acceptance alert has nothing to fire on."""
    proc = subprocess.run(
        [sys.executable, "-m", "dspark_obs", "dashboards", "export", str(tmp_path),
         "--selector", selector, "--runbook-url-base", "https://wiki.example/dspark"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    rules = tmp_path / "rules"
    assert sorted(p.name for p in rules.iterdir()) == sorted(RULES_SHIPPED), proc.stdout
    _promtool("check", "rules", *sorted(rules.glob("*.yml")))
    alerts = (rules / "alerts.yml").read_text()
    assert f"up{{{selector}}} == 0" in alerts
    assert "runbook_url: https://wiki.example/dspark/runbooks.md#dsparkexporterdown" in alerts
    recording = (rules / "recording.yml").read_text()
    code = "\n".join(line for line in recording.splitlines() if not line.strip().startswith("#"))
    series = re.findall(r"(?<![\w:])dspark_\w+(?![\w:])(?:\{[^}]*\})?", code)
    assert series and all(selector in s for s in series), [s for s in series if selector not in s]
    tests = rules / "tests"
    tests.mkdir()
    case = (DEPLOY / "rules" / "tests" / "alerts_test.yml").read_text()
    case = re.sub(r"runbook_url: docs/", "runbook_url: https://wiki.example/dspark/", case)
    (tests / "alerts_test.yml").write_text(case)
    proc = subprocess.run(["promtool", "test", "rules", "alerts_test.yml"], cwd=tests,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (proc.returncode == 0) == fires, proc.stdout + proc.stderr
