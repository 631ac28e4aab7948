"""The real world's committed models: their recorded figures hold, the incremental forward is
the full one, a row's numbers do not depend on its batch, and the training script runs."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from dspark_obs.runtime.real import corpus  # noqa: E402
from dspark_obs.runtime.real.evaluate import anchor_contexts, draft_and_verify  # noqa: E402
from dspark_obs.runtime.real.model import RectangleCache, SlotCache  # noqa: E402
from dspark_obs.runtime.real.session import RealSession  # noqa: E402
from dspark_obs.runtime.real.train import CHECK_WINDOWS, METRICS_NAME, WEIGHTS_NAME  # noqa: E402
from dspark_obs.runtime.real.train import main as train_main  # noqa: E402
from dspark_obs.runtime.real.weights import DEFAULT_WEIGHTS, load  # noqa: E402

RECORDED = json.loads((DEFAULT_WEIGHTS.parent / METRICS_NAME).read_text(encoding="utf-8"))
#: the networks are small: one thread each, here and in the training subprocess, is faster
#: than threads that spin against other processes on a shared machine's few cores
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def models64():
    return load(dtype=torch.float64)


@pytest.fixture(scope="module")
def models32():
    return load(dtype=torch.float32)


def _bits(models, data: bytes, context: int, windows: int) -> float:
    """Next-byte loss in bits, by a plain forward per window and a numpy log-softmax."""
    nats, count = 0.0, 0
    for i in range(windows):
        w = np.frombuffer(data[i * context : (i + 1) * context], dtype=np.uint8).astype(np.int64)
        with torch.no_grad():
            logits, _ = models.target(torch.from_numpy(w[None, :-1]))
        z = logits[0].double().numpy()
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        nats -= logp[np.arange(len(w) - 1), w[1:]].sum()
        count += len(w) - 1
    return nats / count / np.log(2)


def test_weights_are_small_and_were_cut_from_the_committed_heldout():
    assert DEFAULT_WEIGHTS.stat().st_size == RECORDED["weights_bytes"] <= 8 * 2**20
    assert all(RECORDED["heldout_cut_matches"].values())
    for w in corpus.WORKLOADS:
        assert RECORDED["workloads"][w]["heldout_bytes"] == len(corpus.committed_heldout(w))


@pytest.mark.parametrize("workload", corpus.WORKLOADS)
def test_committed_weights_give_their_recorded_heldout_loss(models32, workload):
    """Recorded in float64 on the training device; recomputed here in float32 by another
    route. The two agree to about 1e-7 bits; 1e-5 still catches any change of the weights
    (one more training step moves the figure by far more than that)."""
    data = corpus.committed_heldout(workload)
    got = _bits(models32, data, models32.config.context, CHECK_WINDOWS)
    assert got == pytest.approx(RECORDED["workloads"][workload]["check_bits_per_byte"], abs=1e-5)
    assert 0.3 < got < 4.0


def test_a_cpu_runs_cache_holds_float16_within_its_rounding_of_float32(models32):
    """Keys and values held in float16 give the logits float32's cache gives, but for what
    rounding them to 11 significant bits moves: a little, not nothing (about 1e-3 of the
    largest logit here), on a prompt and two verify steps, one of them truncated."""
    x = torch.from_numpy(
        np.frombuffer(corpus.committed_heldout("code")[2000:2300], dtype=np.uint8).astype(np.int64)
    )[None]
    got = {}
    for held_as in (torch.float16, torch.float32):
        cache = SlotCache(models32.target, slots=2, held_as=held_as)
        slot = np.array([1])
        with torch.no_grad():
            a, _ = models32.target.extend(cache, slot, x[:, :280], np.array([280]))
            b, _ = models32.target.extend(cache, slot, x[:, 280:288], np.array([8]))
            cache.truncate(slot, np.array([283]))
            c, _ = models32.target.extend(cache, slot, x[:, 283:], np.array([17]))
        got[held_as] = torch.cat([a, b, c], dim=1)
        assert cache._store[1].dtype == held_as
    assert SlotCache(models32.target, slots=1).held_as == torch.float16
    moved = (got[torch.float16] - got[torch.float32]).abs().max() / got[torch.float32].abs().max()
    assert 0 < moved < 5e-3


class _ShortSlotCache(SlotCache):
    """Mappings of 16 positions: every slot outgrows its first one, and its second."""

    RESERVE = 16


@pytest.mark.parametrize("layout", [SlotCache, _ShortSlotCache, RectangleCache])
def test_incremental_forward_with_truncation_equals_the_full_forward(models64, layout):
    x = torch.from_numpy(
        np.frombuffer(corpus.committed_heldout("docs")[:90], dtype=np.uint8).astype(np.int64)
    )[None]
    full, full_hidden = models64.target(x)
    cache = layout(models64.target, slots=3)
    slot = np.array([1])
    with torch.no_grad():
        a, ha = models64.target.extend(cache, slot, x[:, :40], np.array([40]))
        b, _ = models64.target.extend(cache, slot, x[:, 40:52], np.array([12]))
        cache.truncate(slot, np.array([45]))  # 7 rejected positions dropped
        c, hc = models64.target.extend(cache, slot, x[:, 45:], np.array([45]))
    got = torch.cat([a, b[:, :5], c], dim=1)
    assert torch.allclose(got, full, rtol=0, atol=1e-10)
    assert torch.allclose(torch.cat([ha, hc], 1)[:, -1], full_hidden[:, -1], rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="beyond"):
        cache.truncate(slot, np.array([91]))


@pytest.mark.parametrize("layout", [SlotCache, RectangleCache])
def test_the_packed_forward_is_the_rectangle_forward_in_packed_order(models64, layout):
    """Rows of other cache lengths and counts (one of a single token), padded past their
    total: the same outputs at every valid token, and the same cache afterwards."""
    text = corpus.committed_heldout("code")
    ids = torch.from_numpy(np.frombuffer(text[:400], dtype=np.uint8).astype(np.int64))
    slots, counts = np.array([2, 0, 3]), np.array([5, 1, 8])
    caches = []
    for _ in range(2):
        cache = layout(models64.target, slots=4)
        for slot, length in zip(slots.tolist(), (30, 61, 7), strict=True):
            prompt = ids[slot * 100 : slot * 100 + length][None]
            models64.target.extend(cache, np.array([slot]), prompt, np.array([length]))
        caches.append(cache)
    block = ids[300:324].view(3, 8)
    with torch.no_grad():
        rect, rect_hidden = models64.target.extend(caches[0], slots, block, counts)
        packed, packed_hidden = models64.target.extend_packed(caches[1], slots, block, counts, 32)
    row, col = torch.nonzero(
        torch.arange(8)[None] < torch.from_numpy(counts)[:, None], as_tuple=True
    )
    n = len(row)
    assert packed.shape[0] == 32 and n == 14
    assert torch.allclose(packed[:n], rect[row, col], rtol=0, atol=1e-10)
    assert torch.allclose(packed_hidden[:n], rect_hidden[row, col], rtol=0, atol=1e-10)
    assert np.array_equal(caches[0].length, caches[1].length)
    ends = caches[0].length[slots]
    kept = [c.save(slots, np.zeros(3, dtype=np.int64), int(ends.max())) for c in caches]
    for slot, end in enumerate(ends.tolist()):
        a, b = (_slot_keys(c, k, slot, end) for c, k in zip(caches, kept, strict=True))
        assert torch.allclose(a, b, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="do not fit"):
        models64.target.extend_packed(caches[1], slots, block, counts, 13)


def _resident_pages(at: tuple[int, int]) -> int | None:
    """Pages of a mapping (address, bytes) resident in memory (`mincore`), None once it is
    unmapped."""
    page = os.sysconf("SC_PAGE_SIZE")
    pages = -(-at[1] // page)
    vec = (ctypes.c_ubyte * pages)()
    mincore = ctypes.CDLL(None, use_errno=True).mincore
    mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if mincore(at[0], pages * page, vec) != 0:
        return None
    return sum(v & 1 for v in vec)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore, private mappings")
def test_a_slot_cache_is_resident_for_what_it_holds_and_freed_at_release(models32):
    """A slot of 100 positions reserves 1,024 of them: 4 MiB of address space in float16, of
    which the pages written are resident (per layer, key or value, and head: 100 positions of
    128 bytes, 4 pages), and `release` unmaps it."""
    cache = SlotCache(models32.target, slots=8)
    slots = np.arange(8)
    tokens = torch.from_numpy(
        np.frombuffer(corpus.committed_heldout("code")[:800], dtype=np.uint8).astype(np.int64)
    ).view(8, 100)
    with torch.no_grad():
        models32.target.extend(cache, slots, tokens, np.full(8, 100))
    assert all(s.shape[3] == SlotCache.RESERVE and s.dtype == torch.float16 for s in cache._store)
    stores = [(s.data_ptr(), s.numel() * s.element_size()) for s in cache._store]
    config = models32.config
    planes = config.layers * 2 * config.heads
    per_plane = -(-100 * (config.width // config.heads) * 2 // os.sysconf("SC_PAGE_SIZE"))
    assert [_resident_pages(s) for s in stores] == [planes * per_plane] * 8
    cache.release(slots[::2])
    assert cache.length.tolist() == [0, 100] * 4
    assert [_resident_pages(s) is None for s in stores] == [True, False] * 4
    with torch.no_grad():  # a released slot prefills afresh
        again, _ = models32.target.extend(cache, slots[:4:2], tokens[:2], np.full(2, 100))
        fresh_cache = SlotCache(models32.target, slots=2)
        fresh, _ = models32.target.extend(fresh_cache, slots[:2], tokens[:2], np.full(2, 100))
    assert torch.equal(again, fresh)


def _slot_keys(cache, saved, row: int, end: int) -> torch.Tensor:
    """Row `row`'s first `end` keys and values, as `cache.save` returned them."""
    if isinstance(cache, SlotCache):
        return saved[3][row][..., :end, :]
    k, v = saved[3]
    return torch.stack([k[:, row, :end], v[:, row, :end]])


def _step(models, slots, prompts, temperature, uniforms, window):
    session = RealSession(models, slots=24)
    session.prefill(slots, prompts)
    drafted = session.draft(slots, temperature, uniforms)
    return drafted, session.verify(slots, drafted.tokens, window)


@pytest.mark.parametrize("precision", ["models64", "models32"])
def test_a_requests_numbers_do_not_depend_on_its_batch(precision, request):
    """The same request alone, and in batches of 4 and 17 with others of other lengths and
    temperatures: identical drafts, draft and target logits. In float64 (rounded through
    float32) also when the batch verifies a longer window; in float32, the precision of a CPU
    run, at one verify width (a runtime verifies every row's whole block)."""
    models = request.getfixturevalue(precision)
    text = corpus.committed_heldout("code")
    prompts = [text[1000:1200], text[50:90], text[3000:3333], text[7000:7060]]
    prompts += [text[8000 + 97 * i : 8050 + 131 * i] for i in range(13)]
    temp = np.resize([0.8, 0.0, 0.0, 1.0], len(prompts))
    u = np.random.default_rng(0).random((len(prompts), 7))
    alone = 3 if precision == "models64" else 7
    alone_d, alone_v = _step(models, np.array([5]), prompts[:1], temp[:1], u[:1], np.array([alone]))
    for rows in (4, len(prompts)):
        slots = np.array([2, 5, 0, 7, *range(8, 8 + len(prompts) - 4)])[:rows]
        window = np.resize([7, 2, 5, 0], rows)
        batch_d, batch_v = _step(models, slots, prompts[:rows], temp[:rows], u[:rows], window)
        assert np.array_equal(alone_d.tokens[0], batch_d.tokens[0])
        assert np.array_equal(alone_d.logprobs[0], batch_d.logprobs[0])
        assert np.array_equal(alone_d.confidence_logits[0], batch_d.confidence_logits[0])
        assert np.array_equal(alone_v[0, : alone + 1], batch_v[0, : alone + 1])
        assert batch_v.shape == (rows, 8, 256)


def test_commit_keeps_the_accepted_prefix_and_drafts_from_the_bonus(models64):
    text = corpus.committed_heldout("docs")
    session = RealSession(models64, slots=2)
    slots = np.array([0, 1])
    session.prefill(slots, [text[:64], text[200:230]])
    assert session.lengths(slots).tolist() == [63, 29]
    drafted = session.draft(slots, np.zeros(2), np.zeros((2, 7)))
    logits = session.verify(slots, drafted.tokens, np.array([7, 4]))
    greedy_hit = logits[:, :-1].argmax(-1) == drafted.tokens
    accepted = np.cumprod(greedy_hit, axis=1).sum(axis=1).clip(max=[7, 4])
    bonus = logits[np.arange(2), accepted].argmax(-1)
    session.commit(slots, accepted, bonus)
    assert session.lengths(slots).tolist() == (np.array([64, 30]) + accepted).tolist()
    # the committed stream, run from scratch, gives the same next draft
    streams = [
        prompt + bytes([*drafted.tokens[row, : accepted[row]].tolist(), bonus[row]])
        for row, prompt in enumerate((text[:64], text[200:230]))
    ]
    fresh = RealSession(models64, slots=2)
    fresh.prefill(slots, streams)
    nxt = session.draft(slots, np.zeros(2), np.zeros((2, 7)))
    assert np.array_equal(nxt.tokens, fresh.draft(slots, np.zeros(2), np.zeros((2, 7))).tokens)
    with pytest.raises(ValueError, match="verify"):
        session.commit(slots, accepted, bonus)


def test_drafter_survival_has_the_recorded_shape(models32):
    """A 47-anchor sample of the code workload against the recorded 383: each position
    within four standard errors of the recorded figure, and decreasing along the block."""
    contexts = anchor_contexts(corpus.committed_heldout("code"), 128, 512, "cpu")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        acc, _ = draft_and_verify(models32, contexts, torch.zeros(len(contexts)), gen)
    survival = np.cumprod(acc.numpy(), axis=1).mean(axis=0)
    recorded = np.array(RECORDED["workloads"]["code"]["greedy"]["survival"])
    se = np.sqrt(recorded * (1 - recorded) / len(contexts))
    assert (np.abs(survival - recorded) <= 4 * se + 0.02).all(), (survival, recorded)
    assert (np.diff(survival) <= 0).all()
    assert survival[0] > 0.5 and survival[-1] < survival[0] * 0.8


def _train(tmp_path, *extra):
    return subprocess.run(
        [sys.executable, "-m", "dspark_obs.runtime.real.train", "--out", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        env=ONE_THREAD,
    )


def _fake_stdlib(root):
    """A library of the three kinds of file, made of the committed held-out text (so the test
    does not depend on what the interpreter ships)."""
    code, docs, news = (corpus.committed_heldout(w) for w in corpus.WORKLOADS)
    (root / "pkg").mkdir(parents=True)
    for i, text in enumerate(code.split(b"\0")):
        (root / "pkg" / f"m{i}.py").write_bytes(text)
    (root / "pydoc_data").mkdir()
    topics = {f"topic{i}": text.decode() for i, text in enumerate(docs.split(b"\0"))}
    (root / "pydoc_data" / "topics.py").write_text(f"topics = {topics!r}\n", encoding="utf-8")
    (root / "idlelib").mkdir()
    for i, name in enumerate(("NEWS.txt", "NEWS2x.txt", "HISTORY.txt")):
        (root / "idlelib" / name).write_bytes(news[i * 7000 : (i + 1) * 7000])
    return root


def test_a_tiny_training_run_on_cpu_writes_loadable_weights(tmp_path):
    done = _train(
        tmp_path,
        "--stdlib",
        str(_fake_stdlib(tmp_path / "lib")),
        "--tiny",
        "--batch",
        "4",
        "--target-steps",
        "4",
        "--drafter-steps",
        "2",
        "--confidence-steps",
        "2",
    )
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / METRICS_NAME).read_text(encoding="utf-8"))
    assert metrics["steps"] == {"target": 4, "drafter": 2, "confidence": 2}
    assert not any(metrics["heldout_cut_matches"].values())
    assert "held-out cut differs" in done.stdout
    tiny = load(tmp_path / WEIGHTS_NAME, dtype=torch.float32)
    assert tiny.config.layers == 1
    for w in corpus.WORKLOADS:
        got = _bits(tiny, corpus.committed_heldout(w), tiny.config.context, CHECK_WINDOWS)
        assert got == pytest.approx(metrics["workloads"][w]["check_bits_per_byte"], abs=1e-5)
        assert len(metrics["workloads"][w]["greedy"]["survival"]) == 7


def test_training_names_what_is_wrong_with_its_input(tmp_path, capsys):
    done = _train(tmp_path, "--stdlib", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert "nowhere" in done.stderr and "Traceback" not in done.stderr
    with pytest.raises(SystemExit) as stop:
        train_main(["--out", str(tmp_path), "--device", "toaster"])
    assert stop.value.code == 2 and "toaster" in capsys.readouterr().err
    bad = tmp_path / "weights.npz"
    bad.write_bytes(b"not a weights file")
    with pytest.raises(ValueError, match="not a real-models weights file"):
        load(bad)
