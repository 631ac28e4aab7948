"""The reference runtime's guarantees, each checked against an independent computation."""

from collections import defaultdict

import numpy as np
import pytest

from dspark_obs.calibration import apply_sts, position_metrics
from dspark_obs.runtime.config import RuntimeConfig
from dspark_obs.runtime.engine import DSparkRuntime, committed_tokens
from dspark_obs.runtime.language import EOS_TOKEN, SyntheticTarget
from dspark_obs.runtime.sts_warmup import warmup_sts


def _run(**kw):
    base = dict(seed=7, concurrency=[24], steps_per_level=80, max_new_tokens=160)
    base.update(kw)
    return list(DSparkRuntime(RuntimeConfig(**base)).run())


def _streams(batches):
    out = defaultdict(list)
    for b in batches:
        for rid, toks in zip(b.rid, committed_tokens(b), strict=True):
            out[rid].extend(toks)
    return out


def _rows(batches, *cols):
    return {
        (rid, int(p)): tuple(getattr(b, c)[i] for c in cols)
        for b in batches
        for i, (rid, p) in enumerate(zip(b.rid, b.prefix_len, strict=True))
    }


@pytest.fixture(scope="module")
def lockstep():
    return {
        "compact": _run(mode="compact", shadow="cap-accept"),
        "cap-accept": _run(mode="cap-accept"),
        "static": _run(mode="static"),
    }


def test_compact_and_cap_accept_commit_identical_streams(lockstep):
    compact, cap = _streams(lockstep["compact"]), _streams(lockstep["cap-accept"])
    assert compact.keys() == cap.keys()
    assert sum(len(v) for v in compact.values()) > 5_000
    for rid in compact:
        assert compact[rid] == cap[rid], rid


def test_compact_trims_and_cap_accept_reports_the_trim(lockstep):
    compact, cap = lockstep["compact"], lockstep["cap-accept"]
    assert np.mean(np.concatenate([b.window for b in compact])) < 6.0
    assert sum(int(b.cap_trim.sum()) for b in cap) > 0
    assert all(int(b.cap_trim.sum()) == 0 for b in compact)


def test_shadow_ceiling_equals_cap_accept_ceiling(lockstep):
    shadow = _rows(lockstep["compact"], "shadow_ceiling")
    cap = {
        k: (v[0] + v[1],)
        for k, v in _rows(lockstep["cap-accept"], "correct_drafts", "cap_trim").items()
    }
    assert shadow.keys() == cap.keys()
    assert shadow == cap


def test_static_accepts_what_cap_accept_reports_as_ceiling(lockstep):
    """Same block state -> same full-block acceptance.

    Greedy streams do not depend on the verify mode, so every (rid, prefix_len)
    both runs visit is the same block state. Sampled streams diverge once the
    modes commit different lengths, so only each request's first block is
    compared for them.
    """
    static = _rows(lockstep["static"], "correct_drafts", "greedy")
    cap = _rows(lockstep["cap-accept"], "correct_drafts", "cap_trim", "greedy")
    first_prefix = {}
    for b in lockstep["cap-accept"]:
        for rid, p in zip(b.rid, b.prefix_len, strict=True):
            first_prefix.setdefault(rid, int(p))
    greedy_common = sampled_first = 0
    for key, (a, trim, greedy) in cap.items():
        if key not in static:
            continue
        if greedy == 1:
            greedy_common += 1
        elif first_prefix[key[0]] == key[1]:
            sampled_first += 1
        else:
            continue
        assert static[key][0] == a + trim, key
    assert greedy_common > 300 and sampled_first > 20


def test_greedy_acceptance_is_argmax_matching():
    """Recompute greedy acceptance from the target alone: walk the block, count argmax matches."""
    batches = _run(mode="static", greedy_fraction=1.0, steps_per_level=20)
    cfg = RuntimeConfig(seed=7)
    target = SyntheticTarget(cfg.workloads, cfg.vocab_size, cfg.seed)
    names = [w.name for w in cfg.workloads]
    from dspark_obs.runtime.hashing import mix
    from dspark_obs.runtime.traffic import Traffic

    traffic = Traffic(
        seed=7,
        mix_weights=cfg.mix,
        greedy_fraction=1.0,
        temperature=0.8,
        prompt_lens=np.array([w.prompt_len for w in cfg.workloads]),
        vocab_size=cfg.vocab_size,
    )
    history = {}
    checked = 0
    for b in batches:
        for i, rid in enumerate(b.rid):
            idx = int(rid.rsplit("-", 1)[1])
            if rid not in history:
                new = traffic.arrivals(idx, 1)
                history[rid] = [int(new.prev2[0]), int(new.prev1[0])]
            salt = mix(np.uint64(7), np.array([idx]), 31)
            wl = np.array([names.index(b.workload[i])])
            toks = list(history[rid])
            run = 0
            for j in range(b.gamma):
                key = target.context_key(
                    salt,
                    np.array([b.prefix_len[i] + j]),
                    np.array([toks[-2]]),
                    np.array([toks[-1]]),
                )
                best = int(target.logits(key, wl).argmax())
                if best != b.draft_tokens[i, j]:
                    break
                run += 1
                toks.append(best)
            assert b.correct_drafts[i] == run
            key = target.context_key(
                salt, np.array([b.prefix_len[i] + run]), np.array([toks[-2]]), np.array([toks[-1]])
            )
            assert b.bonus_token[i] == int(target.logits(key, wl).argmax())
            history[rid] = [*toks, int(b.bonus_token[i])][-2:]
            checked += 1
    assert checked > 200


def test_ceiling_orders_workloads_by_difficulty():
    batches = _run(mode="static", steps_per_level=120)
    ceil = defaultdict(list)
    for b in batches:
        for w, c in zip(b.workload, b.ceiling, strict=True):
            ceil[w].append(c)
    means = {w: np.mean(v) for w, v in ceil.items()}
    assert means["gsm8k"] > means["arena"] > means["poetry"]


def test_requests_finish_at_eos_or_length():
    rt = DSparkRuntime(
        RuntimeConfig(seed=3, concurrency=[16], steps_per_level=200, max_new_tokens=64)
    )
    eos_seen = 0
    for b in rt.run():
        assert (b.acc_len == b.correct_drafts + 1).all()
        eos_seen += sum(EOS_TOKEN in t for t in committed_tokens(b))
    assert rt.finished > 16 and eos_seen > 0


@pytest.fixture(scope="module")
def calibrated_compact():
    config = RuntimeConfig(
        seed=11, mode="compact", shadow="cap-accept", concurrency=[8, 128], steps_per_level=60
    )
    config.sts_temperatures = warmup_sts(config, 120).temperatures
    return list(DSparkRuntime(config).run())


def test_compact_windows_shrink_with_difficulty(calibrated_compact):
    windows = defaultdict(list)
    for b in calibrated_compact:
        for w, n in zip(b.workload, b.window, strict=True):
            windows[w].append(n)
    means = {w: np.mean(v) for w, v in windows.items()}
    assert means["gsm8k"] > means["arena"] > means["poetry"]


def test_budget_per_request_falls_as_concurrency_rises(calibrated_compact):
    low = [b.budget / b.bs for b in calibrated_compact if b.bs == 8]
    high = [b.budget / b.bs for b in calibrated_compact if b.bs == 128]
    assert len(low) == len(high) == 60
    assert np.mean(high) < np.mean(low) - 1.0


def test_compact_utilisation_against_the_lockstep_ceiling_is_high(calibrated_compact):
    """Utilisation = accepted / shadow ceiling, per workload (article: 0.88-0.97)."""
    acc, ceil = defaultdict(int), defaultdict(int)
    for b in calibrated_compact:
        assert (b.shadow_ceiling >= b.correct_drafts).all()
        for w, a, c in zip(b.workload, b.correct_drafts, b.shadow_ceiling, strict=True):
            acc[w] += a
            ceil[w] += c
    util = {w: acc[w] / ceil[w] for w in acc}
    assert all(u > 0.85 for u in util.values()), util
    assert sum(acc.values()) / sum(ceil.values()) > 0.9


def test_sts_lowers_ece_on_held_out_data():
    """Fit on the warm-up traffic, score on a different seed's cap-accept run."""
    config = RuntimeConfig(seed=5, mode="cap-accept", concurrency=[32], steps_per_level=120)
    cal = warmup_sts(config, 150)
    held_out = list(DSparkRuntime(config).run())
    logits = np.concatenate([b.confidence_logits for b in held_out])
    ceiling = np.concatenate([b.ceiling for b in held_out])
    labels = np.arange(config.gamma)[None, :] < ceiling[:, None]
    _, raw_survival = apply_sts(logits, [1.0] * config.gamma)
    _, fitted_survival = apply_sts(logits, cal.temperatures)
    before = [m["ece"] for m in position_metrics(raw_survival, labels)]
    after = [m["ece"] for m in position_metrics(fitted_survival, labels)]
    assert all(a < b for a, b in zip(after, before, strict=True)), (before, after)
    assert np.mean(after) < 0.6 * np.mean(before)
