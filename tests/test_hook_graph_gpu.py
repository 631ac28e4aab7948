"""The hook under CUDA graphs, turned on as `--forward-hooks` turns it on, on a GPU.

bench/hook_graph.py at a small vocabulary: SGLang 0.5.23's `register_forward_hooks` with
the spec `dspark-obs sglang-flag` prints, SGLang's own `DsparkStepObservers` called after
each replay of the captured step with the graph's static logits, and the node consumer's
`/metrics` held to the CPU reference fed the same steps. It runs in a process of its own:
the hook is installed once a process. Skipped without CUDA or SGLang (CI has neither);
the plugin's path is tested on a CPU by tests/test_node_consumer.py.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)
if importlib.util.find_spec("sglang") is None:
    pytest.skip("needs SGLang 0.5.23 (its wheel)", allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = (
    "import json; from bench.hook_graph import measure; "
    "print(json.dumps(measure((16, 64), True, vocab=20_000, hidden=512)))"
)


@pytest.mark.slow
def test_the_hook_under_cuda_graphs_publishes_the_cpu_reference():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    records = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["parameters"]["B"] for r in records] == [16, 64]
    for rec in records:
        assert rec["graph"] and rec["failed"] == 0
        check = rec["metrics"]
        assert check["replay_deterministic"]
        assert check["positions_gathered"] > 0  # tails were walked across steps
        assert check["match"], check["examples"]
