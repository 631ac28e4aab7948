"""Requests in slots over the real models, numpy in and numpy out: what a runtime step calls.

A request's life: `prefill` its prompt (the target runs all but the last byte, which becomes
the first `last` token), then each step `draft` a block, `verify` the last committed token
and the first `window` drafts, and `commit` the accepted count and the bonus token: the
cache keeps the last token and the accepted drafts, drops the rest, and the target's hidden
state at the last accepted position anchors the next draft. Rows are request slots; every
call is one batched forward, and nothing loops over requests but the prompt padding.

Everything returned is rounded through float32 (`model.round_logits`; float32 itself on a
CPU), and so are the hidden states kept for the next draft: a row's numbers do not depend on
which other rows shared its forward (model.py says how each precision keeps that), so
compact (verify the window) and cap-accept (verify the block, commit the window) commit the
same tokens. In float64 they do not depend on how many verify columns it had either; in
float32 they may in their last bits, which a runtime never meets: it verifies every row's
whole block, and the modes differ only in how much of the chain they read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .model import make_cache, round_logits, tiled
from .weights import RealModels

#: prompt tokens one prefill forward runs at most: a step's admissions can bring thousands of
#: prompt bytes, and each holds a few 8 KiB float64 activations (the MLP's) during its forward
PREFILL_TOKENS = 2048


@dataclass(frozen=True)
class Drafted:
    """A drafted block per row: `tokens [B, gamma]`, the draft's log-probabilities
    `[B, gamma, 256]` at the row's temperature (greedy rows: at 1), and the confidence head's
    raw logits `[B, gamma]` (before STS)."""

    tokens: np.ndarray
    logprobs: np.ndarray
    confidence_logits: np.ndarray


def _numpy(x: torch.Tensor) -> np.ndarray:
    """What a runtime reads: `x` rounded through float32, as float64 numpy."""
    return round_logits(x).to(torch.float64).cpu().numpy()


class RealSession:
    def __init__(self, models: RealModels, slots: int) -> None:
        self.models = models
        p = next(models.target.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.gamma = models.config.gamma
        self.cache = make_cache(models.target, slots)
        self.hidden = torch.zeros((slots, models.config.width), dtype=p.dtype, device=p.device)
        self.last = np.zeros(slots, dtype=np.int64)
        self._verified: tuple[np.ndarray, np.ndarray, torch.Tensor] | None = None

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(a, dtype=np.int64), device=self.device)

    def lengths(self, slots: np.ndarray) -> np.ndarray:
        """Committed positions the target has run, per slot (the prompt's and the output's,
        less the last committed token)."""
        return self.cache.length[slots]

    @torch.no_grad()
    def prefill(self, slots: np.ndarray, prompts: list[bytes]) -> None:
        """Start requests in `slots` (whatever they held before) on prompts of >= 2 bytes."""
        if len(prompts) != len(slots) or any(len(p) < 2 for p in prompts):
            raise ValueError("prefill: one prompt of at least 2 bytes per slot")
        slots = np.asarray(slots)
        counts = np.array([len(p) - 1 for p in prompts])
        tokens = np.zeros((len(prompts), counts.max()), dtype=np.int64)
        for row, p in enumerate(prompts):
            tokens[row, : len(p) - 1] = np.frombuffer(p[:-1], dtype=np.uint8)
        self.cache.truncate(slots, np.zeros(len(slots), dtype=np.int64))
        lo = 0
        while lo < len(slots):
            fit = np.searchsorted(np.cumsum(counts[lo:]), PREFILL_TOKENS, side="right")
            hi = lo + max(1, int(fit))
            n = counts[lo:hi]
            chunk = self._t(tokens[lo:hi, : n.max()])
            _, hidden = self.models.target.extend(self.cache, slots[lo:hi], chunk, n)
            rows = torch.arange(hi - lo, device=self.device)
            self.hidden[self._t(slots[lo:hi])] = round_logits(hidden[rows, self._t(n - 1)])
            lo = hi
        self.last[slots] = [p[-1] for p in prompts]

    @torch.no_grad()
    def draft(self, slots: np.ndarray, temperature: np.ndarray, uniforms: np.ndarray) -> Drafted:
        """A block per row: greedy where `temperature == 0`, else sampled at it by inverse CDF
        with the caller's `uniforms [B, gamma]` in [0, 1)."""
        b = len(slots)
        # rows padded to a tile, as `TargetLM.extend` pads its tokens (model.py: batch
        # invariance); the padding drafts greedily from slot 0's state
        pad = np.zeros(tiled(b) - b, dtype=np.int64)
        s = self._t(np.concatenate([np.asarray(slots, dtype=np.int64), pad]))
        block = self.models.drafter.draft(
            self.hidden[s],
            self._t(self.last[s.cpu().numpy()]),
            self._rows(temperature, pad),
            self._rows(uniforms, pad),
        )
        conf = self.models.confidence(block)
        return Drafted(
            block.tokens[:b].cpu().numpy(),
            _numpy(block.logprobs[:b]),
            _numpy(conf[:b]),
        )

    def _rows(self, a: np.ndarray, pad: np.ndarray) -> torch.Tensor:
        """`a` with `len(pad)` zero rows after it, in the networks' dtype."""
        a = np.asarray(a, dtype=np.float64)
        rows = np.concatenate([a, np.zeros((len(pad), *a.shape[1:]))])
        return torch.as_tensor(rows, dtype=self.dtype, device=self.device)

    @torch.no_grad()
    def verify(self, slots: np.ndarray, drafts: np.ndarray, window: np.ndarray) -> np.ndarray:
        """The target's logits `[B, 1 + window.max(), 256]` after the last committed token and
        each of the first `window` drafts; a row's columns past its window are padding."""
        window = np.asarray(window, dtype=np.int64)
        if (window < 0).any() or (window > drafts.shape[1]).any():
            raise ValueError(f"verify: windows must lie in [0, {drafts.shape[1]}]")
        width = 1 + int(window.max(initial=0))
        tokens = np.concatenate([self.last[slots][:, None], drafts[:, : width - 1]], axis=1)
        start = self.cache.length[slots]
        logits, hidden = self.models.target.extend(self.cache, slots, self._t(tokens), window + 1)
        self._verified = (np.array(slots), start, round_logits(hidden))
        return _numpy(logits)

    def commit(self, slots: np.ndarray, accepted: np.ndarray, bonus: np.ndarray) -> None:
        """After `verify` on the same slots: keep the last token and `accepted` drafts in each
        cache, and make `bonus` the token the next draft starts after."""
        if self._verified is None or not np.array_equal(self._verified[0], slots):
            raise ValueError("commit: call verify on the same slots first")
        _, start, hidden = self._verified
        self._verified = None
        self.cache.truncate(slots, start + 1 + accepted)
        rows = torch.arange(len(slots), device=self.device)
        self.hidden[self._t(slots)] = hidden[rows, self._t(accepted)]
        self.last[slots] = bonus

    def release(self, slots: np.ndarray) -> None:
        """Free what `slots` hold: their requests finished (a slot's next request prefills)."""
        self.cache.release(slots)
