"""The real world: real text through the trained networks, in the reference runtime.

Truth is recomputed apart from the engine: every checked block is verified again by the
target's plain causal forward over the request's whole context (its prompt cut from the
held-out sample, then the tokens the run committed), with no KV cache and no batch, and
the block is drafted again from that forward's hidden state. The CLI is run as a user
runs it, in subprocesses, and the SGLang-protocol front is asked over loopback HTTP.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from collections import defaultdict
from contextlib import contextmanager
from itertools import pairwise

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dspark_obs.runtime.acceptance import leading_run
from dspark_obs.runtime.config import STS_WARMUP_STEPS, RuntimeConfig
from dspark_obs.runtime.factory import make_runtime
from dspark_obs.runtime.hashing import mix
from dspark_obs.runtime.real import corpus
from dspark_obs.runtime.real.model import SlotCache, round_logits
from dspark_obs.runtime.real.session import RealSession
from dspark_obs.runtime.real.shipped_sts import default_demo_config, shipped_sts
from dspark_obs.runtime.real.timed_verify import timed_verify
from dspark_obs.runtime.real.weights import DEFAULT_WEIGHTS, load
from dspark_obs.runtime.sts_warmup import warmup_config, warmup_sts
from dspark_obs.runtime.worlds import REAL_WORKLOADS, WORLDS
from dspark_obs.runtime_server import RuntimeFrontend
from dspark_obs.store import open_run

CLI = [sys.executable, "-m", "dspark_obs"]
SMALL = dict(concurrency=[4], steps_per_level=24, max_new_tokens=40)


@pytest.fixture(scope="module")
def weights() -> str:
    """The networks shipped with the package, named as a file."""
    return str(DEFAULT_WEIGHTS)


def _config(weights, **kw) -> RuntimeConfig:
    base = dict(seed=11, world="real", real_weights=weights, **SMALL)
    base.update(kw)
    return RuntimeConfig(**base)


def _run(weights, **kw):
    engine = make_runtime(_config(weights, **kw))
    return engine, list(engine.run())


@pytest.fixture(scope="module")
def twins(weights):
    """A compact run with its cap-accept shadow and a cap-accept run of the same seed."""
    return {
        "compact": _run(weights, mode="compact", shadow="cap-accept")[1],
        "cap-accept": _run(weights, mode="cap-accept")[1],
    }


def _streams(batches) -> dict[str, list[int]]:
    out = defaultdict(list)
    for b in batches:
        a = b.correct_drafts
        for i, rid in enumerate(b.rid):
            out[rid] += [*b.draft_tokens[i, : a[i]].tolist(), int(b.bonus_token[i])]
    return out


def test_real_world_is_named_with_its_workloads_and_vocabulary():
    assert REAL_WORKLOADS == corpus.WORKLOADS
    config = RuntimeConfig(world="real")
    assert config.vocab_size == 256 and config.target == "real"
    assert [w.name for w in config.workloads] == list(corpus.WORKLOADS)
    assert config.timing == "simulated" and RuntimeConfig(world="real", device="cpu").timing == (
        "measured"
    )
    assert WORLDS["real"].retract_rate == 0.0 and WORLDS["real"].lag_steps == 0


def test_compact_and_cap_accept_commit_the_same_tokens(twins):
    compact, cap = (_streams(twins[m]) for m in ("compact", "cap-accept"))
    shared = sorted(set(compact) & set(cap))
    assert len(shared) >= 4
    divergent = []
    for rid in shared:
        n = min(len(compact[rid]), len(cap[rid]))
        if compact[rid][:n] != cap[rid][:n]:
            divergent.append(rid)
    assert divergent == []
    assert sum(min(len(compact[r]), len(cap[r])) for r in shared) > 100
    # the same blocks were drafted, so the shadow's ceiling is the cap-accept run's own
    rows = {}
    for b in twins["cap-accept"]:
        for i, (rid, p) in enumerate(zip(b.rid, b.prefix_len.tolist(), strict=True)):
            rows[rid, p] = (b.draft_tokens[i].tolist(), int(b.correct_drafts[i] + b.cap_trim[i]))
    checked = 0
    for b in twins["compact"]:
        for i, (rid, p) in enumerate(zip(b.rid, b.prefix_len.tolist(), strict=True)):
            if (rid, p) in rows:
                assert rows[rid, p] == (b.draft_tokens[i].tolist(), int(b.shadow_ceiling[i]))
                checked += 1
    assert checked > 60


def _plain_check(models, engine, batch, context, rows) -> int:
    """Draft and verify the rows' blocks again from the plain forward; count the rows."""
    g = batch.gamma
    target, drafter = models.target, models.drafter
    seed = np.uint64(engine.config.seed)
    p_all, q_all = engine.last_distributions()
    for i in rows:
        ctx = torch.tensor(context[batch.rid[i]], dtype=torch.int64)[None]
        _, hidden = target(ctx[:, :-1])
        greedy = bool(batch.greedy[i])
        temp = 1.0 if greedy else float(batch.temperature[i])
        salt = np.uint64(engine.salt[batch.req_pool_index[i]])
        u_draft, u_accept = engine._block_uniforms(
            np.atleast_1d(mix(seed, salt, np.int64(batch.prefix_len[i])))
        )
        block = drafter.draft(
            round_logits(hidden[:, -1]),
            ctx[:, -1],
            torch.tensor([0.0 if greedy else temp], dtype=torch.float32),
            torch.from_numpy(u_draft).float(),
        )
        assert block.tokens[0].tolist() == batch.draft_tokens[i].tolist()
        logits, _ = target(torch.cat([ctx, block.tokens], dim=1))
        lt = round_logits(logits[0, -g - 1 :])
        lp = F.log_softmax(lt / temp, dim=-1)
        lq = F.log_softmax(round_logits(block.logprobs[0]), dim=-1)
        d = block.tokens[0]
        if greedy:
            accepted = (lt[:g].argmax(dim=-1) == d).numpy()
        else:
            ratio = (lp[:g].gather(1, d[:, None]) - lq.gather(1, d[:, None]))[:, 0]
            accepted = u_accept[0] < ratio.clamp(max=0).exp().numpy()
        assert leading_run(accepted[None])[0] == batch.shadow_ceiling[i]
        # the cache's forward and the plain one agree to float32 arithmetic (a CPU run's
        # precision; the two sum attention in other orders): logits within a few 1e-6
        np.testing.assert_allclose(p_all[i], lp.exp().numpy(), rtol=1e-4, atol=1e-9)
        np.testing.assert_allclose(q_all[i], lq.exp().numpy(), rtol=1e-4, atol=1e-9)
        gathered = engine.gather_target_logprobs(np.full(g, i), np.arange(g), batch.draft_tokens[i])
        np.testing.assert_allclose(
            gathered, lp[:g].gather(1, d[:, None])[:, 0], rtol=1e-4, atol=1e-5
        )
    return len(rows)


def test_shadow_ceiling_is_the_accept_chain_of_a_plain_forward(weights):
    """Prompts cut at the salt's offset, blocks drafted and judged again without the cache.

    The run's cache holds its keys and values in float32 here, not in a CPU run's float16:
    what is checked is the runtime's bookkeeping (drafts, shadow ceilings, distributions)
    to float32 arithmetic, where a plain forward redrafts each block token for token.
    `tests/test_real_models.py` checks the float16 cache against float32's."""
    engine = make_runtime(_config(weights, mode="compact", shadow="cap-accept"))
    models = load(weights, dtype=torch.float32)
    session = engine.session
    session.cache = SlotCache(session.models.target, len(session.cache.length), torch.float32)
    texts = {w: corpus.committed_heldout(w) for w in corpus.WORKLOADS}
    context: dict[str, list[int]] = {}
    checked = {"greedy": 0, "sampled": 0}
    with torch.inference_mode():
        for batch in engine.run():
            for i, rid in enumerate(batch.rid):
                if rid not in context:
                    text, n = texts[batch.workload[i]], int(batch.prefix_len[i])
                    salt = int(engine.salt[batch.req_pool_index[i]])
                    context[rid] = list(text[salt % (len(text) - n + 1) :][:n])
            if batch.forward_ct % 4 == 0:
                for kind, want in (("greedy", 1), ("sampled", 0)):
                    rows = np.flatnonzero(batch.greedy == want)[:1].tolist()
                    checked[kind] += _plain_check(models, engine, batch, context, rows)
            for rid, toks in _streams([batch]).items():
                context[rid] += toks
            assert all(len(context[r]) == p + a for r, p, a in zip(
                batch.rid, batch.prefix_len.tolist(), batch.acc_len.tolist(), strict=True
            ))  # fmt: skip
    assert checked["greedy"] >= 3 and checked["sampled"] >= 3, checked


def test_measured_steps_on_a_named_device_commit_what_simulated_ones_do(weights, twins):
    engine, batches = _run(weights, mode="compact", shadow="cap-accept", device="cpu")
    assert engine.measured and engine.config.timing == "measured"
    for b in batches:
        assert b.target_verify_gpu_ms > 0 and b.draft_gpu_ms > 0
        assert b.step_gpu_ms == pytest.approx(b.draft_gpu_ms + b.target_verify_gpu_ms)
    assert _streams(batches) == _streams(twins["compact"])


def test_a_study_on_a_named_device_keeps_the_cost_tables_times(weights, twins):
    """What the studies' `--device` asks for: the networks on the device, the step times
    simulated as without one (the same noise draws, so the same times), the same tokens."""
    engine, batches = _run(
        weights, mode="compact", shadow="cap-accept", device="cpu", simulated_times=True
    )
    assert not engine.measured and engine.config.timing == "simulated"
    plain = twins["compact"]
    assert [b.step_gpu_ms for b in batches] == [b.step_gpu_ms for b in plain]
    assert _streams(batches) == _streams(plain)


def _cli(*args, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    proc = _cli(
        "run", "--world", "real", "--concurrency", "2,4",
        "--steps-per-level", "12", "--max-new-tokens", "40", "--shadow", "cap-accept",
        "--sts-warmup-steps", "12", "--seed", "3", "--out", str(out), "--quiet", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


def test_a_short_real_run_from_the_cli(cli_run):
    run = open_run(cli_run)
    m = run.manifest
    assert (m["world"], m["target"], m["timing"]) == ("real", "real", "simulated")
    assert m["workloads"] == list(corpus.WORKLOADS) and m["config"]["vocab_size"] == 256
    assert m["sts"] is not None and len(m["sts"]["temperatures"]) == 7
    batches = list(run.batches())
    assert len(batches) == 24
    seen = defaultdict(list)
    for b in batches:
        assert b.draft_tokens.max() < 256 and b.bonus_token.max() < 256
        assert (b.shadow_ceiling >= b.correct_drafts).all()
        for rid, p, a in zip(b.rid, b.prefix_len.tolist(), b.acc_len.tolist(), strict=True):
            seen[rid].append((p, a))
    for steps in seen.values():
        assert all(p1 == p0 + a0 for (p0, a0), (p1, _) in pairwise(steps))


@pytest.mark.parametrize(
    "command",
    [
        ["estimate", "{run}"],
        ["calibration", "{run}"],
        ["whatif", "{run}"],
        ["summary", "{run}"],
        ["cost", "fit", "{run}", "--out", "{out}/cost.json"],
        ["report", "{run}", "--out", "{out}/report"],
    ],
)
def test_downstream_commands_read_a_real_run(cli_run, command, tmp_path):
    proc = _cli(*(a.format(run=cli_run, out=tmp_path) for a in command))
    assert proc.returncode == 0, proc.stderr
    if command[0] == "report":
        assert (tmp_path / "report" / "report.html").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--vocab-size", "64"], "vocabulary is its 256 tokens"),
        (["--workloads", "poetry"], "the real world's are code, docs, changelog"),
        (["--real-weights", "no-such.npz"], "no-such.npz: no such weights file"),
        (["--gamma", "5"], "gamma 5"),
        (["--target", "torch"], "runs its own trained target"),
    ],
)
def test_bad_real_world_options_are_refused(weights, args, message, tmp_path):
    base = ["run", "--world", "real", "--sts", "none", "--out", str(tmp_path / "r")]
    if "--real-weights" not in args:
        base += ["--real-weights", weights]
    proc = _cli(*base, *args, "--concurrency", "2", "--steps-per-level", "2", timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()


def _post(url, body):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_runtime_server_answers_a_text_prompt_with_the_targets_greedy_text(weights):
    """Speculative decoding is lossless: a greedy answer is the target's own argmax decoding."""
    prompt = "def parse(text):\n    "
    config = _config(weights, concurrency=[4], max_new_tokens=64)
    with RuntimeFrontend(config, port=0) as front:
        greedy = {"max_new_tokens": 12, "temperature": 0}
        status, out = _post(front.url, {"text": prompt, "sampling_params": greedy})
        assert status == 200, out
        again = _post(front.url, {"text": prompt, "sampling_params": greedy})[1]
        status, bad = _post(front.url, {"input_ids": [300, 4], "sampling_params": greedy})
        sampled = _post(front.url, {"text": "x", "sampling_params": {"max_new_tokens": 6}})[1]
    ids = out["output_ids"]
    assert again["output_ids"] == ids and out["meta_info"]["prompt_tokens"] == len(prompt)
    assert status == 400 and "bytes" in bad["error"]["message"]
    assert all(0 <= t < 256 for t in sampled["output_ids"]) and sampled["output_ids"]
    models = load(weights, dtype=torch.float32)
    context = list(prompt.encode())
    with torch.inference_mode():
        for _ in range(len(ids)):
            logits, _ = models.target(torch.tensor([context]))
            context.append(int(round_logits(logits[0, -1]).argmax()))
            if context[-1] == 0:
                break
    expected = context[len(prompt) :]
    assert ids == expected
    text = bytes(expected[:-1] if expected[-1] == 0 else expected)
    assert out["text"] == text.decode("utf-8", errors="replace")


def test_a_finished_requests_cache_is_freed_at_once(weights):
    """After every step, a slot whose request finished in it holds nothing (a CPU run's
    caches are mappings of their own, given back to the system)."""
    engine = make_runtime(_config(weights))
    cache = engine.session.cache
    for _ in engine.run():
        idle = np.flatnonzero(~engine.active)
        assert (cache.length[idle] == 0).all()
        assert all(cache._store[s] is None for s in idle.tolist())
        busy = np.flatnonzero(engine.active)
        assert all(cache._store[s] is not None for s in busy.tolist())
    assert engine.finished >= 2


def test_timed_verify_leaves_the_cache_as_it_was(weights):
    """Timed over other tokens than the ones verified, so that an undone write shows."""
    session = RealSession(load(weights), 6)
    slots = np.array([1, 3, 4])
    text = corpus.committed_heldout("code")
    session.prefill(slots, [text[i * 300 : i * 300 + 40 + 9 * i] for i in range(3)])
    drafted = session.draft(slots, np.zeros(3), np.zeros((3, 7)))
    start = session.lengths(slots)
    session.verify(slots, drafted.tokens, np.full(3, 7))
    cache = session.cache
    ends = cache.length[slots].copy()

    def state():
        _, _, length, kept = cache.save(slots, np.zeros(3, dtype=np.int64), int(ends.max()))
        return length.copy(), [t[..., :end, :] for t, end in zip(kept, ends, strict=True)]

    before = state()
    other = np.concatenate([session.last[slots][:, None], drafted.tokens[:, ::-1]], axis=1)
    seconds = timed_verify(session, slots, start, (other + 1) % 256, np.array([2, 7, 0]), 16)
    assert seconds > 0
    after = state()
    assert np.array_equal(before[0], after[0]) and np.array_equal(after[0], ends)
    assert all(torch.equal(a, b) for a, b in zip(before[1], after[1], strict=True))


def _cli_config(*args) -> RuntimeConfig:
    """The configuration a command builds from its arguments, as its handler does."""
    from dspark_obs.cli.main import build_parser
    from dspark_obs.cli.runtime_args import config_from_args

    return config_from_args(build_parser().parse_args(list(args)))


def test_the_default_warm_up_is_shipped_and_is_what_the_warm_up_fits():
    """`demo --world real` and `run --world real` read the shipped fit, and running the
    warm-up again gives that fit bit for bit; another seed misses it."""
    shipped = [
        shipped_sts(warmup_config(_cli_config(cmd, "--world", "real"), STS_WARMUP_STEPS))
        for cmd in ("demo", "run")
    ]
    assert shipped[0] is not None and shipped[0] == shipped[1]
    other = _cli_config("demo", "--world", "real", "--seed", "1")
    assert shipped_sts(warmup_config(other, STS_WARMUP_STEPS)) is None
    fitted = warmup_sts(default_demo_config(), STS_WARMUP_STEPS, use_shipped=False)
    assert fitted == shipped[0]


def test_a_warm_up_that_runs_is_shown_step_by_step_and_a_shipped_one_is_not(weights):
    seen = []

    @contextmanager
    def progress(warm):
        seen.append((warm.mode, warm.concurrency, warm.steps_per_level))
        yield lambda batch: seen.append(batch.bs)
        seen.append("done")

    config = _config(weights, seed=5)
    fitted = warmup_sts(config, 6, concurrency=4, progress=progress)
    assert seen == [("cap-accept", [4], 6), 4, 4, 4, 4, 4, 4, "done"]
    assert fitted == warmup_sts(config, 6, concurrency=4)  # the same fit without it
    seen.clear()
    assert warmup_sts(default_demo_config(), STS_WARMUP_STEPS, progress=progress) is not None
    assert seen == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a pseudo-terminal")
def test_the_demo_shows_its_warm_up_before_its_run(tmp_path):
    """On a terminal, `demo --world real` with a warm-up that is not shipped draws the
    warm-up's bar, then the run's."""
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [*CLI, "demo", "--world", "real", "--no-serve", "--concurrency", "2",
         "--steps-per-level", "4", "--sts-warmup-steps", "4", "--max-new-tokens", "20",
         "--seed", "3", "--out", str(tmp_path / "run")],
        stdout=subprocess.DEVNULL, stderr=secondary, env={**os.environ, "COLUMNS": "120"},
    )  # fmt: skip
    os.close(secondary)
    screen = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        screen += chunk
    os.close(primary)
    assert proc.wait(timeout=300) == 0
    text = screen.decode(errors="replace")
    assert "STS warm-up" in text and "compact run" in text
    assert text.index("STS warm-up") < text.index("compact run")
    assert "4/4 steps" in text[: text.index("compact run")]
