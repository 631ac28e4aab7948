"""The synchronous hook the always-on one replaced, kept as the reference in tests, and
a stream of SGLang verify steps to drive both. It walks no tails: the reference pipeline's
walk is the estimator's own (`estimator/tails.py`), which asks `gather` for what it needs.

`reference_batch` turns one observer call into a StepBatch the simple way: every
log-probability of every request from the step's logits, copied to the host at once,
and a gather that reads the verify logits when the walker asks. The new hook must
give the same StepBatches wherever it computes a value, and the same aggregates,
calibration and ceilings.

`StepStream` plays a DSpark server at the observer's interface (SGLang 0.5.23's
keywords and tensor shapes, on CPU): requests in pool slots, a token stream per
request that drafts and tails agree with often enough for tails to run on over
several steps, greedy and sampled requests, retraction (a request re-admitted in
a new slot) and slot reuse.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from dspark_obs.hooks.token_logprobs import token_logprobs_torch
from dspark_obs.telemetry import StepBatch


def _np(t) -> np.ndarray:
    # (the old hook called .numpy() on bf16 too, which numpy cannot hold: SGLang's
    # confidence_raw is bf16 where the confidence head is, and that hook failed on it)
    t = t.detach()
    return (t.float() if t.dtype == torch.bfloat16 else t).to("cpu").numpy()


def reference_batch(
    kw: dict, gamma: int, mode: str = "compact", rank: int = 0, logprobs=token_logprobs_torch
):
    """`logprobs` is the torch form in tests; the old hook dispatched to the fused kernel on
    a GPU (`hooks.token_logprobs.token_logprobs`), which bench/hook_step.py passes."""
    g = gamma
    draft = kw["draft_tokens"]
    dev = draft.device
    bs = int(kw["bs"])
    rows_per_req = g + 1
    cl = kw["correct_len"].to(torch.int64)
    layout = kw["layout"]
    verify_len = (
        layout.verify_lens.to(torch.int64)
        if layout is not None
        else torch.full((bs,), rows_per_req, dtype=torch.int64, device=dev)
    )
    block = kw["draft_block"]
    info = kw["sampling_info"]
    temps = (info.temperatures if info is not None else block.temperatures).reshape(bs)
    temps = temps.to(torch.float32)
    greedy = block.greedy_mask.reshape(bs).to(torch.bool)
    target = kw["target_logits"]
    b = torch.arange(bs, device=dev)
    j = torch.arange(g, device=dev)
    flat_rows = (b[:, None] * rows_per_req + j[None, :]).reshape(-1)
    flat_draft = draft.reshape(-1).to(torch.int64)
    target_lp = logprobs(target, flat_rows, flat_draft, temps.repeat_interleave(g))
    target_lp = target_lp.reshape(bs, g)
    verified = j[None, :] < (verify_len - 1)[:, None]
    target_lp = torch.where(verified, target_lp, torch.full_like(target_lp, float("nan")))
    if block.corrected_logits is None:  # a greedy draft: one-hot, log q = 0
        draft_lp = torch.zeros(bs, g, device=dev)
    else:
        draft_lp = logprobs(
            block.corrected_logits.reshape(bs * g, -1),
            torch.arange(bs * g, device=dev),
            flat_draft,
            block.temperatures.reshape(bs).to(torch.float32).repeat_interleave(g),
        ).reshape(bs, g)
    bonus = kw["bonus"].to(torch.int64)
    bonus_lp = logprobs(target, b * rows_per_req + cl, bonus, temps)
    conf, raw = kw["confidence"], kw["confidence_raw"]
    greedy_np = _np(greedy).astype(np.int8)
    batch = StepBatch(
        forward_ct=int(kw["forward_ct"]),
        gamma=g,
        mode=mode,
        rank=rank,
        bs=bs,
        budget=None if kw["verify_token_budget"] is None else int(kw["verify_token_budget"]),
        num_running_reqs=bs,
        num_verify_tokens=int(kw["verify_tier_num_tokens"]),
        verify_tokens_local=int(kw["verify_tier_num_tokens"]),
        verify_tokens_graph_key=int(kw["verify_tier_num_tokens"]),
        rid=np.array([r.rid for r in kw["reqs"]] + [None], dtype=object)[:bs],
        workload=np.full(bs, "other", dtype=object),
        req_pool_index=_np(kw["req_pool_indices"]).astype(np.int64),
        prefix_len=_np(kw["prefix_lens"]).astype(np.int64),
        verify_len=_np(verify_len),
        correct_drafts=_np(cl),
        acc_len=_np(kw["commit_lens"]).astype(np.int64),
        cap_trim=_np(kw["cap_trim_lens"]).astype(np.int64),
        bonus_token=_np(bonus),
        greedy=greedy_np,
        temperature=np.where(greedy_np == 1, 0.0, _np(temps).astype(np.float64)),
        shadow_ceiling=np.full(bs, -1, dtype=np.int64),
        bonus_logprob=_np(bonus_lp).astype(np.float64),
        draft_tokens=_np(draft).astype(np.int64),
        confidence=None if conf is None else _np(conf).astype(np.float64).reshape(bs, g),
        survival=None
        if conf is None
        else np.cumprod(_np(conf).astype(np.float64).reshape(bs, g), axis=1),
        confidence_logits=None if raw is None else _np(raw).astype(np.float64).reshape(bs, g),
        draft_logprobs=_np(draft_lp).astype(np.float64),
        target_logprobs=_np(target_lp).astype(np.float64),
    )

    def gather(rows: np.ndarray, positions: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        r = torch.as_tensor(rows, device=dev)
        at = r * rows_per_req + torch.as_tensor(positions, device=dev)
        lp = logprobs(target, at, torch.as_tensor(tokens, device=dev), temps[r])
        return _np(lp).astype(np.float64)

    return batch, gather


class FakeObservers:
    """An observer with SGLang 0.5.23's `observe_verify_step` keyword signature (held to
    SGLang's own source by tests/test_sglang_real_types.py), doing nothing but count."""

    def __init__(self) -> None:
        self.calls = 0

    def observe_verify_step(
        self, *, forward_ct, reqs, bs, proposal_folded, verify_ids_2d, target_logits, layout,
        confidence, confidence_raw, prefix_lens, draft_tokens, draft_block, sampling_info,
        correct_len, cap_trim_lens, bonus, commit_lens, verify_token_budget, req_pool_indices,
        verify_tier_num_tokens, dp_tier_num_tokens,
    ) -> None:  # fmt: skip
        self.calls += 1


class StepStream:
    """Observer keyword sets for a run of verify steps; see the module's docstring."""

    def __init__(
        self,
        gamma: int = 4,
        vocab: int = 12,
        requests: int = 6,
        *,
        seed: int = 0,
        greedy_every: int = 2,
        greedy_draft: bool = False,
        confidence: bool = True,
        folded: bool = False,
        agree: float = 0.75,
        moves: bool = True,
        rid_prefix: str = "req",
    ) -> None:
        self.g, self.v = gamma, vocab
        self.rid_prefix = rid_prefix
        self.rng = np.random.default_rng(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.greedy_draft, self.confidence, self.folded = greedy_draft, confidence, folded
        self.agree = agree
        self.moves = moves
        self.greedy_every = greedy_every
        self.next_rid = 0
        self.free_slots = list(range(2 * requests + 4))[::-1]
        self.reqs: list[dict] = [self._new_request() for _ in range(requests)]
        self.fct = 0

    def _new_request(self, prefix: int | None = None, slot: int | None = None) -> dict:
        rid = self.next_rid
        self.next_rid += 1
        return {
            "rid": f"{self.rid_prefix}-{rid}",
            "slot": self.free_slots.pop() if slot is None else slot,
            "prefix": int(self.rng.integers(5, 40)) if prefix is None else prefix,
            "greedy": self.greedy_every > 0 and rid % self.greedy_every == 0,
            "seed": int(self.rng.integers(1 << 30)),
        }

    def truth(self, req: dict, pos: int) -> int:
        return int(np.random.default_rng([req["seed"], pos]).integers(self.v))

    def _draft(self, req: dict, pos: int) -> int:
        if self.rng.random() < self.agree:
            return self.truth(req, pos)
        return int(self.rng.integers(self.v))

    def churn(self) -> None:
        """Now and then: a request retracted and re-admitted in a new slot (same rid,
        same position), or one that finishes and a new one that takes its slot (at the
        very position the old one would have continued from)."""
        r = self.rng.random()
        if r < 0.08:
            if not self.moves:
                return
            req = self.reqs[int(self.rng.integers(len(self.reqs)))]
            self.free_slots.insert(0, req["slot"])
            req["slot"] = self.free_slots.pop()
        elif r < 0.16:
            i = int(self.rng.integers(len(self.reqs)))
            old = self.reqs[i]
            self.reqs[i] = self._new_request(prefix=old["prefix"], slot=old["slot"])

    def step(self) -> dict:
        self.churn()
        g, v = self.g, self.v
        live = [r for r in self.reqs if self.rng.random() < 0.9] or self.reqs[:1]
        bs = len(live)
        draft = np.zeros((bs, g), np.int64)
        windows = np.zeros(bs, np.int64)
        accepted = np.zeros(bs, np.int64)
        bonus = np.zeros(bs, np.int64)
        for i, req in enumerate(live):
            p = req["prefix"]
            draft[i] = [self._draft(req, p + j) for j in range(g)]
            w = int(self.rng.integers(0, g + 1))
            a = 0
            while a < w and draft[i, a] == self.truth(req, p + a):
                a += 1
            windows[i], accepted[i] = w, a
            bonus[i] = self.truth(req, p + a)
        prefix = torch.tensor([r["prefix"] for r in live])
        greedy = torch.tensor([r["greedy"] for r in live])
        temps = torch.where(greedy, 1.0, torch.tensor(0.6 + 0.1 * (np.arange(bs) % 5)).float())
        w = torch.tensor(windows)
        kw = dict(
            forward_ct=self.fct,
            reqs=[SimpleNamespace(rid=r["rid"]) for r in live],
            bs=bs,
            proposal_folded=self.folded,
            verify_ids_2d=torch.zeros(bs, g + 1, dtype=torch.int64),
            target_logits=torch.randn(bs * (g + 1), v, generator=self.gen) * 2,
            layout=SimpleNamespace(verify_lens=(w + 1).to(torch.int32)),
            confidence=torch.rand(bs, g, generator=self.gen) if self.confidence else None,
            confidence_raw=torch.randn(bs, g, generator=self.gen) if self.confidence else None,
            prefix_lens=prefix,
            draft_tokens=torch.tensor(draft),
            draft_block=SimpleNamespace(
                draft_tokens=torch.tensor(draft),
                corrected_logits=None
                if self.greedy_draft
                else torch.randn(bs, g, v, generator=self.gen) * 2,
                greedy_mask=greedy,
                temperatures=temps.clone(),
                greedy_draft=self.greedy_draft,
            ),
            sampling_info=SimpleNamespace(temperatures=temps[:, None].clone()),
            correct_len=torch.tensor(accepted),
            cap_trim_lens=torch.zeros(bs, dtype=torch.int64),
            bonus=torch.tensor(bonus),
            commit_lens=torch.tensor(accepted) + 1,
            verify_token_budget=int(w.sum()),
            req_pool_indices=torch.tensor([r["slot"] for r in live]),
            verify_tier_num_tokens=int((w + 1).sum()),
            dp_tier_num_tokens=None,
        )
        for i, req in enumerate(live):
            req["prefix"] += int(accepted[i]) + 1
        self.fct += 1
        return kw
