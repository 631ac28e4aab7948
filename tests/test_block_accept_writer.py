"""SGLang's block-accept JSONL written from the reference runtime, held against the runtime.

The file must parse with our reader and walk with `walk_blocks`; here every line and
every block is recomputed independently from the runtime's steps: which request-steps
get a line, which open a block, and, along each request's committed token stream, how
far each block's tail walks and the product of its acceptance ratios under the
runtime's exact distributions. (tests/test_sglang_block_accept_writer.py holds the
same writer against SGLang's own recorder.)
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from dspark_obs.estimator.block_accept_truth import block_truth, row_truth
from dspark_obs.estimator.block_accept_walk import walk_blocks

from dspark_obs.recording import record_reference_run, write_block_accept_step
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.runtime.language import PRESETS, WorkloadProfile
from dspark_obs.store import open_run
from dspark_obs.telemetry.block_accept_log import read_block_accept_jsonl
from dspark_obs.telemetry.block_accept_writer import BlockAcceptWriter

from .conftest import cli

# short answers: requests often stop at EOS with blocks pending
SHORT = [PRESETS["gsm8k"], WorkloadProfile("short", peak=4.0, mean_output_len=6.0)]


def _recorded(config: RuntimeConfig):
    """The JSONL of a run, and per step what the runtime knew: the batch, its target
    distributions, and the requests that finished (with natural stops)."""
    runtime = DSparkRuntime(config)
    out = io.StringIO()
    writer = BlockAcceptWriter(out, config.gamma)
    steps = []
    for batch in runtime.run():
        write_block_accept_step(writer, runtime, batch)
        rows, natural = runtime.finished_in_last_step()
        p = runtime.last_distributions()[0].copy()
        steps.append((batch, p, dict(zip(batch.rid[rows].tolist(), natural.tolist(), strict=True))))
    return out.getvalue(), steps


def _expected_blocks(steps, gamma: int) -> dict:
    """Per block (rid, fct): the walk recomputed along the request's committed stream.

    Each committed position is found in the step that committed it, and the target's
    probability of the tail token is read from that step's distribution at that
    verify row: the context is the committed prefix, which equals the tail's own as
    long as the walk goes on. The walk stops after the first realized token that
    differs, at gamma, or where the request committed nothing more.
    """
    stream: dict[str, dict[int, tuple[int, int, int]]] = {}
    natural: dict[str, bool] = {}
    opened = []
    for s, (batch, _, finished) in enumerate(steps):
        natural.update(finished)
        for r, rid in enumerate(batch.rid.tolist()):
            cl, w, pre = batch.correct_drafts[r], batch.window[r], batch.prefix_len[r]
            tokens = [*batch.draft_tokens[r, :cl].tolist(), int(batch.bonus_token[r])]
            for j, t in enumerate(tokens):
                stream.setdefault(rid, {})[pre + j] = (t, s, r)
            if batch.greedy[r] == 0 and cl == w < gamma:
                opened.append((rid, batch.forward_ct, s, r))
    out = {}
    for rid, fct, s, r in opened:
        batch = steps[s][0]
        w, pre = batch.window[r], batch.prefix_len[r]
        prod, lo, walked, diverged = 1.0, float(w), 0, False
        for o in range(w + 1, gamma + 1):
            pos = pre + o - 1
            if pos not in stream[rid]:
                break
            realized, s2, r2 = stream[rid][pos]
            token = batch.draft_tokens[r, o - 1]
            p = steps[s2][1][r2, pos - steps[s2][0].prefix_len[r2], token]
            prod *= min(1.0, p / np.exp(batch.draft_logprobs[r, o - 1]))
            lo += prod
            walked += 1
            if realized != token:
                diverged = True
                break
        if diverged or w + walked == gamma:
            status = "resolved"
        else:
            status = "eos" if natural.get(rid) else "open"
        out[(rid, fct)] = (walked, prod, lo, status)
    return out


@pytest.mark.parametrize(
    "config",
    [
        dict(mode="compact", shadow="cap-accept", vocab_size=8, workloads=SHORT, mix=[1, 1]),
        dict(mode="cap-accept", vocab_size=32),
    ],
    ids=["compact", "cap-accept"],
)
def test_lines_and_walks_agree_with_the_runtime(config):
    c = RuntimeConfig(seed=3, concurrency=[4, 16], steps_per_level=120, max_new_tokens=96, **config)
    text, steps = _recorded(c)
    lines = [json.loads(line) for line in text.splitlines()]
    rows = [line for line in lines if "eos_end" not in line]
    # a line for exactly every sampled request-step, in step and row order, with its values
    want = [
        (rid, b.forward_ct, int(w), int(cl), int(ct), bool(cl == w < c.gamma))
        for b, _, _ in steps
        for rid, w, cl, ct, greedy in zip(
            b.rid, b.window, b.correct_drafts, b.cap_trim, b.greedy, strict=True
        )
        if greedy == 0
    ]
    got = [(r["rid"], r["fct"], r["w"], r["cl"], r["ct"], "trimmed_tokens" in r) for r in rows]
    assert got == want

    log = read_block_accept_jsonl(text.splitlines())
    assert log.bad_lines == log.orphan_entries == log.token_mismatches == log.unknown_eos == 0
    walk = walk_blocks(log, c.gamma)
    expected = _expected_blocks(steps, c.gamma)
    keys = list(zip(walk["rid"].tolist(), walk["block_fct"].tolist(), strict=True))
    assert sorted(keys) == sorted(expected)
    walked, prod, lo, status = (np.array(v) for v in zip(*(expected[k] for k in keys), strict=True))
    np.testing.assert_array_equal(walk["walked"], walked)
    np.testing.assert_allclose(walk["prod"], prod, rtol=1e-9)
    np.testing.assert_allclose(walk["lo"], lo, rtol=1e-9)
    np.testing.assert_array_equal(walk["status"], status)
    # the run exercised what the file can say: walks that diverge, reach gamma, stay open
    assert (walked > 1).any() and (w := walk["window"] + walked == c.gamma).any() and (~w).any()
    if c.mode == "compact":
        assert (status == "eos").any()
    else:
        assert any(r["ct"] > 0 for r in rows)


def test_a_recorded_run_writes_the_jsonl_and_holds_its_truth(tmp_path):
    """`record_reference_run(..., sglang_jsonl=)` writes the file beside the run; the
    truth of each block is the shadow ceiling of its request-step, and a row that opened
    no block has the exact ceiling the file itself gives (cl + ct)."""
    c = RuntimeConfig(
        seed=5, concurrency=[4, 16], steps_per_level=60, max_new_tokens=96, shadow="cap-accept"
    )
    path = tmp_path / "ba.jsonl"
    record_reference_run(c, tmp_path / "run", None, sglang_jsonl=path)
    run = open_run(tmp_path / "run")
    log = read_block_accept_jsonl(path)
    shadow = {
        (rid, b.forward_ct): int(s)
        for b in run.batches()
        for rid, s in zip(b.rid.tolist(), b.shadow_ceiling.tolist(), strict=True)
    }
    want = [shadow[k] for k in zip(log.block_rid.tolist(), log.block_fct.tolist(), strict=True)]
    truth = block_truth(log, run)
    np.testing.assert_array_equal(truth, want)
    assert (truth >= log.block_window).all() and log.n_blocks > 50
    rows = row_truth(log, run)
    exact = ~log.row_opens
    np.testing.assert_array_equal(rows[exact], (log.row_cl + log.row_ct)[exact])
    # a request-step the run does not have has no truth
    stranger = {"rid": "gsm8k-999999", "fct": 0, "w": 6, "cl": 6, "ct": 0}
    other = read_block_accept_jsonl([json.dumps(stranger | {"trimmed_tokens": [1], "q_lp": [0.0]})])
    assert np.isnan(block_truth(other, run)).all() and len(other.block_fct) == 1


def test_run_writes_the_jsonl_that_estimate_reads(tmp_path):
    path = tmp_path / "ba.jsonl"
    args = ["--concurrency", "4", "--steps-per-level", "40", "--sts", "none", "--quiet"]
    cli("run", "--out", str(tmp_path / "run"), "--sglang-jsonl", str(path), *args)
    report = json.loads(
        cli("estimate", "--sglang-jsonl", str(path), "--gamma", "7", "--json").stdout
    )
    log = read_block_accept_jsonl(path)
    assert report["bad_lines"] == 0
    assert sum(w["sampled"]["blocks"] for w in report["workloads"].values()) == log.n_blocks > 0
    again = cli(
        "run", "--out", str(tmp_path / "run2"), "--sglang-jsonl", str(path), *args, check=False
    )
    assert again.returncode == 2 and "exists" in again.stderr
    assert not (tmp_path / "run2").exists()
