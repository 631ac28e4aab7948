"""The torch target: real forwards, measured step times, lockstep preserved (CPU build in CI)."""

from collections import defaultdict

import pytest

pytest.importorskip("torch")

from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime, committed_tokens


def _run(mode: str, **kw):
    cfg = RuntimeConfig(
        seed=2,
        mode=mode,
        target="torch",
        torch_hidden=64,
        concurrency=[12],
        steps_per_level=40,
        max_new_tokens=120,
        **kw,
    )
    return list(DSparkRuntime(cfg).run())


def test_compact_and_cap_accept_stay_in_lockstep_on_the_torch_target():
    streams = {}
    for mode in ("compact", "cap-accept"):
        out = defaultdict(list)
        for b in _run(mode):
            for rid, toks in zip(b.rid, committed_tokens(b), strict=True):
                out[rid].extend(toks)
        streams[mode] = out
    assert streams["compact"] == streams["cap-accept"]
    assert sum(map(len, streams["compact"].values())) > 1000


def test_step_times_are_measured_on_every_step():
    """That they grow with the verify size is a speed claim: bench/torch_verify.py (P8)."""
    cfg = RuntimeConfig(
        seed=2,
        mode="compact",
        target="torch",
        torch_hidden=256,
        concurrency=[1, 128],
        steps_per_level=15,
        max_new_tokens=400,
    )
    assert cfg.timing == "measured"
    batches = list(DSparkRuntime(cfg).run())
    assert {b.bs for b in batches} == {1, 128}
    assert all(b.step_gpu_ms > 0 and b.draft_gpu_ms > 0 for b in batches)
    for b in batches:  # a step is its draft and its verify, both timed
        assert b.target_verify_gpu_ms > 0
        assert b.step_gpu_ms == pytest.approx(b.draft_gpu_ms + b.target_verify_gpu_ms)
