"""Walks that survive slot changes: requests retracted and re-admitted into another slot.

SGLang retracts decoding requests under memory pressure and re-admits them later,
often into another `req_pool_index`, with steps between where they are absent. The
walk follows a block by its request's rid, so it must come out as if the request had
kept its slot: greedy ceilings exact, censored only where the committed stream ends
before the tail resolves (the request finished), and a sampled block's interval the
one of the same stream without the move. Truth is computed here from the generated
token streams, not from the walker.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from dspark_obs.estimator.tails import TailWalker

from dspark_obs.store.reader import open_run

from .conftest import cli
from .test_tails import LOG, PASSES, Req, make_batch, stable_logp

G = 4
VOCAB = 5
IDS = ["numpy", "compiled"]


def greedy_traffic(seed: int, n_steps: int = 160, running: int = 6, slots: int = 9):
    """Greedy requests with known token streams, retracted and re-admitted elsewhere.

    Each request commits its own true stream (`truth[p]` at absolute position p); its
    drafts follow the stream with probability 0.7 per position, so a block's exact
    ceiling is the run of leading drafts equal to the stream. A running request is
    retracted with probability 0.06 per step, absent for 1..6 steps, and re-admitted
    into a free slot other than its last one; finished requests free their slot for new
    ones. Returns the steps and, per trimmed request-step (rid, fct), its exact ceiling
    and whether the request's stream ended before the tail resolved.
    """
    rng = np.random.default_rng(seed)
    reqs: dict[str, dict] = {}
    free = list(range(slots))
    waiting: list[tuple[int, str]] = []  # (step it comes back at, rid)
    moves: list[tuple[str, int]] = []  # (rid, step it came back at)
    blocks: dict[tuple[str, int], dict] = {}
    counter = 0
    steps = []
    for fct in range(n_steps):
        for back_at, rid in sorted(waiting):
            if back_at <= fct and free:
                waiting.remove((back_at, rid))
                choices = [s for s in free if s != reqs[rid]["slot"]] or free
                slot = int(rng.choice(choices))
                free.remove(slot)
                reqs[rid]["slot"] = slot
                moves.append((rid, fct))
        while len([r for r in reqs.values() if r["slot"] >= 0]) < running and free:
            rid = f"q{counter}"
            counter += 1
            prompt = int(rng.integers(3, 20))
            length = prompt + int(rng.integers(15, 60))
            reqs[rid] = {
                "slot": free.pop(int(rng.integers(len(free)))),
                "prefix": prompt,
                "end": length,
                "truth": rng.integers(0, VOCAB, length + G + 1),
            }
        rows = []
        for rid, r in reqs.items():
            if r["slot"] < 0 or r["prefix"] >= r["end"]:
                continue
            if rng.random() < 0.06:
                free.append(r["slot"])
                r["slot"] = -2  # retracted: absent, and no slot, until it comes back
                waiting.append((fct + int(rng.integers(1, 7)), rid))
                continue
            p, truth = r["prefix"], r["truth"]
            right = rng.random(G) < 0.7
            off = rng.integers(1, VOCAB, G)
            drafts = np.where(right, truth[p : p + G], (truth[p : p + G] + off) % VOCAB)
            leading = int(np.argmin(np.append(drafts == truth[p : p + G], False)))
            w = int(rng.integers(0, G + 1))
            a = min(w, leading)
            rows.append(Req(rid, r["slot"], p, w, a, drafts.tolist(), int(truth[p + a])))
            if a == w < G:
                # the tail resolves at its first mismatch, or its last position if none
                blocks[(rid, fct)] = {"ceiling": leading, "settles_at": p + min(leading, G - 1)}
            r["prefix"] = p + a + 1
            if r["prefix"] >= r["end"]:
                free.append(r["slot"])
                r["slot"] = -1  # finished
        order = rng.permutation(len(rows))
        steps.append(make_batch(fct, [rows[i] for i in order], logprobs=False))
    for (rid, _), blk in blocks.items():
        # committed positions end at the request's last prefix (a request still running
        # when the traffic ends is cut there too)
        blk["ends_first"] = blk["settles_at"] >= reqs[rid]["prefix"]
    return steps, blocks, moves


def walked(steps, compiled: bool, **kw) -> dict[tuple[str, int], dict]:
    tw = TailWalker(G, compiled=compiled, walk_every=5)
    frames = [tw.step(b, np.zeros(b.num_reqs, np.int64), **kw) for b in steps]
    frames.append(tw.close())
    assert tw.pending() == 0 and tw.away == {}
    out = {}
    for frame in frames:
        for i in range(len(frame.get("rid", []))):
            key = (str(frame["rid"][i]), int(frame["open_fct"][i]))
            assert key not in out
            out[key] = {k: v[i] for k, v in frame.items()}
    return out


@pytest.mark.parametrize("compiled", PASSES, ids=IDS[: len(PASSES)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_censored_share_is_the_share_that_really_ends_first(seed, compiled):
    steps, truth, moves = greedy_traffic(seed)
    got = walked(steps, compiled)
    assert set(got) == set(truth)
    censored = {k for k, b in got.items() if b["status"] == 2}
    assert censored == {k for k, b in truth.items() if b["ends_first"]}
    for key, blk in got.items():
        if key not in censored:
            assert blk["lo"] == blk["point"] == blk["hi"] == truth[key]["ceiling"], key
    # the traffic moved requests while their blocks were open: a walk keyed by slot alone
    # would have lost these
    across = [
        k
        for k, b in got.items()
        if k not in censored
        and any(r == k[0] and k[1] < at <= b["resolved_fct"] for r, at in moves)
    ]
    assert len(moves) >= 10 and len(across) >= 5, (len(moves), len(across))
    assert 0 < len(censored) < 0.2 * len(got)


def sampled_stream(seed: int, n: int = 40):
    """One sampled request's rows (slot 1), tokens matching often so tails walk on."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, 3, 4 * n + G + 1)
    rows, p = [], 0
    for _ in range(n):
        right = rng.random(G) < 0.75
        drafts = np.where(right, truth[p : p + G], (truth[p : p + G] + 1) % 3)
        leading = int(np.argmin(np.append(drafts == truth[p : p + G], False)))
        w = int(rng.integers(0, G))
        a = min(w, leading)
        rows.append(
            Req(
                "s",
                1,
                p,
                w,
                a,
                drafts.tolist(),
                int(truth[p + a]),
                greedy=0,
                q_lp=LOG(rng.uniform(0.05, 1.0, G)).tolist(),
                p_lp=LOG(rng.uniform(0.05, 1.0, G)).tolist(),
                bonus_lp=float(LOG(rng.uniform(0.05, 1.0))),
            )
        )
        p += a + 1
    return rows


@pytest.mark.parametrize("compiled", PASSES, ids=IDS[: len(PASSES)])
def test_sampled_block_walks_on_across_a_move_with_the_same_interval(compiled):
    """Stream A keeps slot 1; stream B is the same rows, the request moving to slot 6 and
    later to slot 3, with steps between where it is absent and another request sits in
    its old slot at exactly the prefix it would continue (only the rid tells them apart)."""
    rows = sampled_stream(3)
    stable = [make_batch(2 * i, [r]) for i, r in enumerate(rows)]
    moved = []
    slot = 1
    for i, r in enumerate(rows):
        if i in (12, 25):
            # the request is away for a step: another request holds its old slot there,
            # at the prefix the request would have continued from
            old = slot
            slot = {12: 6, 25: 3}[i]
            ghost = Req("other", old, r.prefix, G, 0, [4] * G, 4, greedy=1)
            moved.append(make_batch(2 * i - 1, [ghost]))
        moved.append(make_batch(2 * i, [Req(**{**r.__dict__, "slot": slot})]))

    def gather_for(batches):
        by_fct = {b.forward_ct: b for b in batches}
        current = {}

        def gather(rows_, offsets, tokens):
            b = current["batch"]
            return np.array(
                [
                    stable_logp(b.rid[r], int(b.prefix_len[r]) + int(o), int(t))
                    for r, o, t in zip(
                        rows_.tolist(), offsets.tolist(), tokens.tolist(), strict=True
                    )
                ]
            )

        return by_fct, current, gather

    outs = {}
    for name, batches in (("stable", stable), ("moved", moved)):
        _, current, gather = gather_for(batches)
        tw = TailWalker(G, compiled=compiled, walk_every=3)
        frames = []
        for b in batches:
            current["batch"] = b
            frames.append(tw.step(b, np.zeros(b.num_reqs, np.int64), gather=gather))
        frames.append(tw.close())
        outs[name] = {
            int(f["open_fct"][i]): {k: v[i] for k, v in f.items()}
            for f in frames
            for i in range(len(f.get("rid", [])))
            if f["rid"][i] == "s"
        }
    assert set(outs["stable"]) == set(outs["moved"])
    for fct, want in outs["stable"].items():
        have = outs["moved"][fct]
        for col in ("status", "resolved_fct", "window"):
            assert have[col] == want[col], (fct, col)
        for col in ("lo", "point", "hi", "var"):
            assert float(have[col]) == pytest.approx(float(want[col]), abs=1e-12), (fct, col)
    # blocks were mid-walk at the moves (opened before, settled after), and resolved
    spans = [
        b
        for f, b in outs["stable"].items()
        if f < 23 < b["resolved_fct"] or f < 49 < b["resolved_fct"]
    ]
    assert spans and all(b["status"] == 1 for b in spans)


# -- ingest of a /server_info dump --------------------------------------------------------

SAMPLES = Path(__file__).parent / "data" / "sglang"
GREEDY = SAMPLES / "server_info.compact.greedy.json"


def _ingest_ceilings(tmp_path: Path, payload: dict, name: str) -> pl.DataFrame:
    src = tmp_path / f"{name}.json"
    src.write_text(json.dumps(payload))
    out = tmp_path / name
    cli("ingest", str(src), "--out", str(out), "--assume", "greedy")
    return open_run(out).scan("ceilings").collect().sort("rid", "forward_ct")


def test_ingest_follows_a_request_whose_pool_index_changes(tmp_path):
    """The issue's failing path: `ingest` of a greedy dump where a request's
    req_pool_index changes mid-life. Its blocks open across the change must come out as
    they do with the slot unchanged."""
    payload = json.loads(GREEDY.read_text())
    records = payload["internal_states"][0]["dspark_info_record"]["records"]
    before = _ingest_ceilings(tmp_path, payload, "stable")
    # a block that stayed open for several steps, and the request that opened it
    spanning = before.filter(
        (pl.col("status") == "exact") & (pl.col("resolved_at") > pl.col("forward_ct") + 1)
    ).row(0, named=True)
    rid, move_at = spanning["rid"], spanning["forward_ct"] + 1
    used = {r["req_pool_index"] for rec in records for r in rec.get("reqs") or []}
    new_slot = max(used) + 7
    moved_rows = 0
    for rec in records:
        if rec["forward_ct"] >= move_at:
            for r in rec.get("reqs") or []:
                if r["rid"] == rid:
                    r["req_pool_index"] = new_slot
                    moved_rows += 1
    assert moved_rows
    after = _ingest_ceilings(tmp_path, payload, "moved")
    assert after.height == before.height
    assert after.equals(before)
    assert (after["status"] == "censored").sum() == (before["status"] == "censored").sum()
