"""No behaviour change by accident: a fixed stored run's outputs through every published path.

`summary --json`, `estimate --json`, `whatif --json`, `report`'s report.json (real
subprocesses) and the `/metrics` text of a real `serve` replay over HTTP, against the outputs
recorded in tests/data/golden/expected (how they were made, and when to remake them:
tests/golden_outputs.py).
"""

from __future__ import annotations

import pytest

from tests.golden_outputs import EXPECTED, NAMES, capture, differences


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return capture(tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("name", NAMES)
def test_output_equals_the_recorded_one(outputs, name):
    want = (EXPECTED / name).read_text()
    found = differences(name, outputs[name], want)
    assert not found, f"{name} changed:\n" + "\n".join(found[:20])


def test_the_comparison_sees_a_changed_value():
    """The comparison itself must not pass everything: a changed count or float is caught."""
    text = (EXPECTED / "metrics.txt").read_text()
    line = next(x for x in text.splitlines() if x.startswith("dspark_request_steps_total{"))
    head, value = line.rsplit(" ", 1)
    changed = text.replace(line, f"{head} {int(value) + 1}", 1)
    assert differences("metrics.txt", changed, text)
    assert differences("summary.json", '{"a": 1.0}', '{"a": 1.000001}')
    assert not differences("summary.json", '{"a": 1.0}', '{"a": 1.0000000000001}')
