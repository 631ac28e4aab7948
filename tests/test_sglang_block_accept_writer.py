"""The block-accept JSONL writer against SGLang 0.5.23's own recorder, on the same steps.

The reference runtime's steps are fed both to our `BlockAcceptWriter` and to SGLang's
real `DsparkStepObservers` with its `BlockAcceptEstimateRecorder` switched on
(`SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH`), the recorder getting the step as the
worker hands it over: target logits per verify row and the drafter's corrected logits
(the runtime's distributions as logits at each request's temperature), the verify
layout, and `note_request_finished` for every request that ended. The two files must
agree line for line. Needs the `sglang` package (tools/test.sh runs this file in its
second environment; elsewhere it skips); what around SGLang's types is not its own is
in tests/sglang_real.py.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import sys
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

import dspark_obs  # noqa: E402
from dspark_obs.runtime.config import RuntimeConfig  # noqa: E402
from dspark_obs.runtime.engine import DSparkRuntime  # noqa: E402
from dspark_obs.runtime.language import PRESETS, WorkloadProfile  # noqa: E402
from dspark_obs.telemetry.block_accept_writer import BlockAcceptWriter  # noqa: E402
from tests.sglang_real import as_sglang, observers  # noqa: E402


def test_dspark_obs_is_one_tree():
    """Every dspark_obs module loaded comes from the repository under test: with the
    package on PYTHONPATH and another checkout installed editable, subpackages mapped
    from the repository root (estimator, exporters) could silently come from the other."""
    importlib.import_module("dspark_obs.estimator")
    importlib.import_module("dspark_obs.exporters")
    root = Path(dspark_obs.__file__).resolve().parents[2]
    files = [
        Path(m.__file__).resolve()
        for name, m in list(sys.modules.items())
        if name.split(".")[0] == "dspark_obs" and getattr(m, "__file__", None)
    ]
    assert all(f.is_relative_to(root) for f in files), sorted({f.parent for f in files})


def _sglang_step(batch, p: np.ndarray, q: np.ndarray) -> dict:
    """SGLang's observer call for a runtime step: logits are log-probabilities times the
    temperature, so SGLang's softmax(logits / T) gives back the runtime's distributions."""
    bs, g = batch.bs, batch.gamma
    greedy = batch.greedy == 1
    temps = np.where(greedy, 1.0, batch.temperature)
    with np.errstate(divide="ignore"):
        target = temps[:, None, None] * np.log(p)
        corrected = temps[:, None, None] * np.log(q)
    t = torch.from_numpy
    t32 = torch.tensor(temps, dtype=torch.float32)
    w = t(batch.verify_len).to(torch.int32)
    return as_sglang(
        dict(
            forward_ct=batch.forward_ct,
            reqs=[SimpleNamespace(rid=r) for r in batch.rid.tolist()],
            bs=bs,
            proposal_folded=False,
            verify_ids_2d=torch.zeros(bs, g + 1, dtype=torch.int64),
            target_logits=t(target.reshape(bs * (g + 1), -1)).float(),
            layout=SimpleNamespace(verify_lens=w),
            confidence=t(batch.confidence).float(),
            confidence_raw=t(batch.confidence_logits).float(),
            prefix_lens=t(batch.prefix_len),
            draft_tokens=t(batch.draft_tokens),
            draft_block=SimpleNamespace(
                draft_tokens=t(batch.draft_tokens),
                corrected_logits=t(corrected).float(),
                greedy_mask=t(greedy),
                temperatures=t32.clone(),
                greedy_draft=False,
            ),
            sampling_info=SimpleNamespace(temperatures=t32[:, None].clone()),
            correct_len=t(batch.correct_drafts),
            cap_trim_lens=t(batch.cap_trim),
            bonus=t(batch.bonus_token),
            commit_lens=t(batch.acc_len),
            verify_token_budget=int(batch.window.sum()),
            req_pool_indices=t(batch.req_pool_index),
            verify_tier_num_tokens=int(batch.verify_len.sum()),
            dp_tier_num_tokens=None,
        )
    )


def _same(ours, theirs, where: str) -> None:
    if isinstance(theirs, float):
        assert isinstance(ours, float), where
        assert ours == theirs or math.isclose(ours, theirs, rel_tol=1e-6, abs_tol=1e-6), (
            where,
            ours,
            theirs,
        )
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), (where, ours, theirs)
        for k in theirs:
            _same(ours[k], theirs[k], f"{where}.{k}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), (where, ours, theirs)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert type(ours) is type(theirs) and ours == theirs, (where, ours, theirs)


def _rows(batch, keep: np.ndarray):
    """The step with only the rows `keep`: the other requests skip it, as a request that
    SGLang retracted and re-admitted later does."""
    per_row = {
        f.name: v[keep]
        for f in fields(batch)
        if isinstance(v := getattr(batch, f.name), np.ndarray) and len(v) == batch.bs
    }
    return replace(batch, bs=len(keep), num_running_reqs=len(keep), **per_row)


# short answers: requests often stop at EOS with blocks pending (the eos_end markers)
SHORT = [PRESETS["gsm8k"], WorkloadProfile("short", peak=4.0, mean_output_len=6.0)]


@pytest.mark.parametrize(
    ("config", "skip"),
    [
        (dict(mode="compact", shadow="cap-accept", vocab_size=8, workloads=SHORT, mix=[1, 1]), 0),
        (dict(mode="cap-accept", vocab_size=24, temperature=1.0), 0),
        (dict(mode="compact", vocab_size=16), 0.1),
    ],
    ids=["compact-shadow", "cap-accept", "requests-skip-steps"],
)
def test_the_same_lines_as_sglangs_recorder(config, skip, tmp_path, monkeypatch):
    """Line for line, over every kind of line and entry: blocks opened, walked, diverged,
    run to gamma, pending at an EOS; in the last case requests now and then miss a step,
    so that blocks are dropped at the sequence-length discontinuity."""
    path = tmp_path / "sglang.jsonl"
    monkeypatch.setenv("SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH", str(path))
    c = RuntimeConfig(seed=3, concurrency=[4, 16], steps_per_level=150, max_new_tokens=96, **config)
    runtime = DSparkRuntime(c)
    obs = observers(c.gamma)
    ours = io.StringIO()
    writer = BlockAcceptWriter(ours, c.gamma)
    rng = np.random.default_rng(7)
    for batch in runtime.run():
        keep = np.flatnonzero(rng.random(batch.bs) >= skip)
        step = _rows(batch, keep)
        p, q = runtime.last_distributions()
        obs.observe_verify_step(**_sglang_step(step, p[keep], q[keep]))
        writer.observe(step, lambda r, j, t, k=keep: runtime.gather_target_logprobs(k[r], j, t))
        rows, natural = runtime.finished_in_last_step()
        finished = batch.rid[rows].tolist()
        for rid, stop in zip(finished, natural.tolist(), strict=True):
            obs.note_request_finished(rid=rid, natural_stop=stop)
        writer.finished(finished, natural.tolist())
    obs.note_prefill_step()  # flushes the recorder's file
    theirs = [json.loads(line) for line in path.read_text().splitlines()]
    mine = [json.loads(line) for line in ours.getvalue().splitlines()]
    assert len(mine) == len(theirs)
    for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
        _same(a, b, f"line {i + 1}")
    # the comparison covered every kind of line and entry
    assert sum("trimmed_tokens" in line for line in theirs) > 50
    entries = [e for line in theirs for e in line.get("pg", ())]
    assert len(entries) > 100 and any(e[3] == e[4] for e in entries)
    assert any(e[1] == c.gamma for e in entries)
    if c.mode == "cap-accept":
        assert any(line.get("ct", 0) > 0 for line in theirs)
    elif not skip:
        assert any("eos_end" in line for line in theirs)
    else:
        assert obs._block_accept_recorder._discontinuity_drop_ct > 0
