"""Each world has the property it claims, and truth stays exact in every one of them.

Properties are checked by computations of their own: the draft probability read off the
step's draft log-probabilities, the lagged budget replanned from the steps two before,
slot moves traced through the rows, greedy ceilings walked on the target alone.
"""

import argparse
import json
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest

from dspark_obs.cli.runtime_args import add_runtime_arguments, config_from_args
from dspark_obs.recording.reference import runtime_manifest
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime
from dspark_obs.runtime.hashing import uniform
from dspark_obs.runtime.language import SyntheticTarget
from dspark_obs.runtime.traffic import Traffic
from dspark_obs.runtime.worlds import SYNTHETIC_WORLDS, WORLDS
from dspark_obs.store import open_run

GOLDEN_RUN = Path(__file__).parent / "data" / "golden" / "run"


def _config(world, **kw):
    base = dict(seed=5, world=world, concurrency=[32], steps_per_level=80, max_new_tokens=160)
    base.update(kw)
    return RuntimeConfig(**base)


@pytest.fixture(scope="module")
def runs():
    """Per world: a compact run with its cap-accept shadow, a cap-accept twin, the engine."""
    out = {}
    for world in SYNTHETIC_WORLDS:
        compact = DSparkRuntime(_config(world, mode="compact", shadow="cap-accept"))
        out[world] = {
            "config": compact.config,
            "engine": compact,
            "compact": list(compact.run()),
            "cap-accept": list(DSparkRuntime(_config(world, mode="cap-accept")).run()),
        }
    return out


def _rows(batches, *cols):
    return {
        (rid, int(p)): tuple(getattr(b, c)[i] for c in cols)
        for b in batches
        for i, (rid, p) in enumerate(zip(b.rid, b.prefix_len, strict=True))
    }


def _parser():
    p = argparse.ArgumentParser()
    add_runtime_arguments(p, steps_per_level=10, concurrency="4")
    return p


def test_unknown_world_is_refused_with_the_known_names():
    with pytest.raises(ValueError, match=r"unknown world 'nope'.*adversarial-confidence"):
        RuntimeConfig(world="nope").validate()
    with pytest.raises(SystemExit):
        _parser().parse_args(["--world", "nope"])


def test_world_is_recorded_and_brings_its_workloads():
    config = config_from_args(_parser().parse_args(["--world", "unstable-slots"]))
    manifest = runtime_manifest(config, None)
    assert manifest["world"] == manifest["config"]["world"] == "unstable-slots"
    assert manifest["workloads"] == [w.name for w in WORLDS["unstable-slots"].workloads]
    assert config.mix == [1.0, 1.0, 1.0]
    named = config_from_args(
        _parser().parse_args(["--world", "unstable-slots", "--workloads", "a=3"])
    )
    assert [w.name for w in named.workloads] == ["a"] and named.mix == [1.0]
    default = config_from_args(_parser().parse_args([]))
    assert default.world == "reference"
    assert [w.name for w in default.workloads] == ["gsm8k", "arena", "poetry"]


def test_reference_world_reproduces_the_golden_run():
    """The stored golden run was recorded before worlds existed; the default world replays it."""
    recorded = json.loads((GOLDEN_RUN / "run.json").read_text())["config"]
    config = RuntimeConfig(
        seed=recorded["seed"],
        mode=recorded["mode"],
        shadow=recorded["shadow"],
        concurrency=recorded["concurrency"],
        steps_per_level=recorded["steps_per_level"],
        sts_temperatures=recorded["sts_temperatures"],
    )
    assert config.world == "reference"
    stored = list(open_run(GOLDEN_RUN).batches())
    fresh = list(DSparkRuntime(config).run())
    assert len(stored) == len(fresh) == 80
    cols = ("prefix_len", "verify_len", "correct_drafts", "shadow_ceiling", "bonus_token")
    for a, b in zip(stored, fresh, strict=True):
        assert a.rid.tolist() == b.rid.tolist() and a.budget == b.budget
        assert a.lag_steps == b.lag_steps == 0
        for c in (*cols, "draft_tokens", "req_pool_index"):
            assert np.array_equal(getattr(a, c), getattr(b, c)), c
        np.testing.assert_allclose(a.confidence, b.confidence, atol=1e-4)


@pytest.mark.parametrize("world", SYNTHETIC_WORLDS)
def test_shadow_ceiling_equals_the_cap_accept_twins_ceiling(runs, world):
    shadow = _rows(runs[world]["compact"], "shadow_ceiling")
    cap = {
        k: (v[0] + v[1],)
        for k, v in _rows(runs[world]["cap-accept"], "correct_drafts", "cap_trim").items()
    }
    assert len(shadow) > 2000
    assert shadow == cap


@pytest.mark.parametrize("world", SYNTHETIC_WORLDS)
def test_greedy_ceiling_is_the_targets_argmax_run(runs, world):
    """Walk every greedy block on the target alone: drafts kept while each is its argmax.

    The request's context starts from its arrival (traffic) and follows the committed
    tokens, so this also checks that retracted requests come back where they stopped.
    """
    config = runs[world]["config"]
    target = SyntheticTarget(config.workloads, config.vocab_size, config.seed)
    traffic = Traffic(
        seed=config.seed,
        mix_weights=config.mix,
        greedy_fraction=config.greedy_fraction,
        temperature=config.temperature,
        prompt_lens=np.array([w.prompt_len for w in config.workloads]),
        vocab_size=config.vocab_size,
    )
    context = {}
    checked = 0
    for b in runs[world]["compact"]:
        rows = np.flatnonzero(b.greedy == 1)
        for i in rows.tolist():
            if b.rid[i] not in context:
                new = traffic.arrivals(int(b.rid[i].rsplit("-", 1)[1]), 1)
                context[b.rid[i]] = (new.salt, int(new.prev2[0]), int(new.prev1[0]))
        salt = np.array([context[b.rid[i]][0][0] for i in rows], dtype=np.uint64)
        prev2 = np.array([context[b.rid[i]][1] for i in rows])
        prev1 = np.array([context[b.rid[i]][2] for i in rows])
        run = np.zeros(len(rows), dtype=np.int64)
        alive = np.ones(len(rows), dtype=bool)
        for j in range(b.gamma):
            key = target.context_key(salt, b.prefix_len[rows] + j, prev2, prev1)
            best = target.logits(key, b.workload_codes[rows]).argmax(axis=1)
            alive &= best == b.draft_tokens[rows, j]
            run += alive
            prev2, prev1 = prev1, b.draft_tokens[rows, j]
        assert np.array_equal(run, b.shadow_ceiling[rows])
        a = b.correct_drafts
        for i in rows.tolist():
            stream = [*context[b.rid[i]][1:], *b.draft_tokens[i, : a[i]].tolist()]
            context[b.rid[i]] = (context[b.rid[i]][0], *[*stream, int(b.bonus_token[i])][-2:])
        checked += len(rows)
    assert checked > 800


def _appearances(batches):
    seen = defaultdict(list)
    for b in batches:
        for i, rid in enumerate(b.rid):
            seen[rid].append(
                (b.forward_ct, int(b.req_pool_index[i]), int(b.prefix_len[i]), int(b.acc_len[i]))
            )
    return seen


@pytest.mark.parametrize("world", SYNTHETIC_WORLDS)
def test_committed_streams_are_continuous(runs, world):
    for rid, steps in _appearances(runs[world]["compact"]).items():
        for (_, _, p0, n0), (_, _, p1, _) in pairwise(steps):
            assert p1 == p0 + n0, rid


def test_retracted_requests_come_back_in_another_slot_after_a_gap(runs):
    moves = gaps = 0
    for steps in _appearances(runs["unstable-slots"]["compact"]).values():
        for (t0, s0, _, _), (t1, s1, _, _) in pairwise(steps):
            gaps += t1 > t0 + 1
            moves += s1 != s0
            assert (s1 != s0) == (t1 > t0 + 1), "a request moves exactly when it was out"
    assert moves == gaps > 20
    assert runs["unstable-slots"]["engine"].retracted >= moves
    for steps in _appearances(runs["reference"]["compact"]).values():
        assert all(s == steps[0][1] for _, s, _, _ in steps)
        assert all(t1 == t0 + 1 for (t0, *_), (t1, *_) in pairwise(steps))


def test_confidence_is_the_draft_probability_of_the_drafted_token(runs):
    """No STS here, so the head's output is the draft's own probability, clipped."""
    batches = runs["adversarial-confidence"]["compact"]
    q = np.exp(np.concatenate([b.draft_logprobs for b in batches]))
    confidence = np.concatenate([b.confidence for b in batches])
    np.testing.assert_allclose(confidence, np.clip(q, 1e-6, 1 - 1e-6), rtol=1e-9, atol=1e-12)
    reference = runs["reference"]["compact"]
    q_ref = np.exp(np.concatenate([b.draft_logprobs for b in reference]))
    assert np.abs(np.concatenate([b.confidence for b in reference]) - q_ref).mean() > 0.05


def _first_position(run, hard):
    """Drafted token at position 0, whether it was accepted, and the head's confidence."""
    batches = run["compact"]
    token = np.concatenate([b.draft_tokens[:, 0] for b in batches])
    accepted = np.concatenate([b.shadow_ceiling for b in batches]) >= 1
    confidence = np.concatenate([b.confidence[:, 0] for b in batches])
    return hard[token], accepted, confidence


def _hard_tokens(config):
    """The over-proposed ids, drawn again from their key: a quarter of the vocabulary."""
    token = np.arange(config.vocab_size, dtype=np.uint64)
    hard = uniform(np.uint64(config.seed ^ 0x5EED), token, 24) < 0.25
    hard[0] = False
    return hard


def test_acceptance_depends_on_the_drafted_token(runs):
    config = runs["adversarial-confidence"]["config"]
    hard = _hard_tokens(config)
    assert np.array_equal(
        np.flatnonzero(hard), runs["adversarial-confidence"]["engine"].drafter.hard_tokens
    )
    gap = {}
    for world in ("reference", "adversarial-confidence"):
        is_hard, accepted, _ = _first_position(runs[world], hard)
        assert is_hard.sum() > 200 and (~is_hard).sum() > 200
        gap[world] = accepted[~is_hard].mean() - accepted[is_hard].mean()
    assert abs(gap["reference"]) < 0.05 and gap["adversarial-confidence"] > 0.3, gap


def test_hidden_difficulty_moves_acceptance_at_equal_confidence(runs):
    """Within each decile of confidence, requests of high hidden fidelity accept more."""
    gaps = {}
    for world in ("reference", "adversarial-confidence"):
        run = runs[world]
        config = run["config"]
        salt = (
            Traffic(
                seed=config.seed,
                mix_weights=config.mix,
                greedy_fraction=config.greedy_fraction,
                temperature=config.temperature,
                prompt_lens=np.array([w.prompt_len for w in config.workloads]),
                vocab_size=config.vocab_size,
            )
            .arrivals(0, run["engine"].arrived)
            .salt
        )
        index = np.array([int(r.rsplit("-", 1)[1]) for b in run["compact"] for r in b.rid])
        factor = 1.0 - 0.4 * uniform(np.uint64(config.seed ^ 0x5EED), salt[index], 23)
        _, accepted, confidence = _first_position(run, np.zeros(config.vocab_size, bool))
        low, high = factor < 0.8, factor > 0.9
        decile = np.searchsorted(np.quantile(confidence, np.linspace(0, 1, 11)[1:-1]), confidence)
        per_bin = [
            accepted[(decile == k) & high].mean() - accepted[(decile == k) & low].mean()
            for k in range(10)
            if ((decile == k) & high).sum() > 30 and ((decile == k) & low).sum() > 30
        ]
        assert len(per_bin) >= 3
        gaps[world] = np.mean(per_bin)
    assert abs(gaps["reference"]) < 0.05 and gaps["adversarial-confidence"] > 0.08, gaps


def test_budget_is_planned_on_the_confidence_of_two_steps_before(runs):
    """Replan every step: the budget from the same requests' survival two steps earlier (1
    where the slot held another request or none), the windows from the current survival."""
    run = runs["unstable-slots"]
    table = run["config"].cost_table
    history = {}
    lagged_differs = 0
    for b in run["compact"]:
        assert b.lag_steps == 2
        old = history.get(b.forward_ct - 2, {})
        lagged = np.ones_like(b.survival)
        for i, (rid, slot) in enumerate(zip(b.rid, b.req_pool_index.tolist(), strict=True)):
            if old.get(slot, (None,))[0] == rid:
                lagged[i] = np.cumprod(old[slot][1])
        history[b.forward_ct] = {
            slot: (rid, b.confidence[i])
            for i, (rid, slot) in enumerate(zip(b.rid, b.req_pool_index.tolist(), strict=True))
        }

        def best_budget(survival, bs=b.bs):
            gains = np.concatenate(([0.0], np.cumsum(np.sort(survival.ravel())[::-1])))
            return int(np.argmax((bs + gains) / table.step_seconds(bs, np.arange(len(gains)))))

        k = best_budget(lagged)
        assert b.budget == k
        lagged_differs += k != best_budget(b.survival)
        # the k highest current survivals, ties to earlier positions, counted per request
        flat = [(-s, j, i) for i, row in enumerate(b.survival.tolist()) for j, s in enumerate(row)]
        chosen = np.bincount([i for _, _, i in sorted(flat)[:k]], minlength=b.bs)
        assert np.array_equal(b.window, chosen)
    assert lagged_differs > 40


def test_workloads_sit_near_one_and_near_gamma(runs):
    windows = defaultdict(list)
    for b in runs["unstable-slots"]["compact"]:
        for w, n in zip(b.workload, b.window, strict=True):
            windows[w].append(n)
    means = {w: np.mean(v) for w, v in windows.items()}
    gamma = runs["unstable-slots"]["config"].gamma
    assert means["copy"] > gamma - 0.5 and means["noise"] < 1.5, means
