"""Requests in slots over the real models, numpy in and numpy out: what a runtime step calls.

A request's life: `prefill` its prompt (the target runs all but the last byte, which becomes
the first `last` token), then each step `draft` a block, `verify` the last committed token
and the first `window` drafts, and `commit` the accepted count and the bonus token: the
cache keeps the last token and the accepted drafts, drops the rest, and the target's hidden
state at the last accepted position anchors the next draft. Rows are request slots; every
call is one batched forward, and nothing loops over requests but the prompt padding.

Everything returned is float64 rounded through float32 (`model.round_logits`), and so are
the hidden states kept for the next draft: a row's numbers do not depend on which other
rows, or how many verify columns, shared its forward, so compact (verify the window) and
cap-accept (verify the block, commit the window) commit the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .model import KVCache, round_logits
from .weights import RealModels


@dataclass(frozen=True)
class Drafted:
    """A drafted block per row: `tokens [B, gamma]`, the draft's log-probabilities
    `[B, gamma, 256]` at the row's temperature (greedy rows: at 1), and the confidence head's
    raw logits `[B, gamma]` (before STS)."""

    tokens: np.ndarray
    logprobs: np.ndarray
    confidence_logits: np.ndarray


class RealSession:
    def __init__(self, models: RealModels, slots: int) -> None:
        self.models = models
        p = next(models.target.parameters())
        self.device, self.dtype = p.device, p.dtype
        self.gamma = models.config.gamma
        self.cache = KVCache(models.target, slots)
        self.hidden = torch.zeros((slots, models.config.width), dtype=p.dtype, device=p.device)
        self.last = np.zeros(slots, dtype=np.int64)
        self._verified: tuple[np.ndarray, torch.Tensor, torch.Tensor] | None = None

    def _t(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(np.asarray(a, dtype=np.int64), device=self.device)

    def lengths(self, slots: np.ndarray) -> np.ndarray:
        """Committed positions the target has run, per slot (the prompt's and the output's,
        less the last committed token)."""
        return self.cache.length[self._t(slots)].cpu().numpy()

    @torch.no_grad()
    def prefill(self, slots: np.ndarray, prompts: list[bytes]) -> None:
        """Start requests in `slots` (whatever they held before) on prompts of >= 2 bytes."""
        if len(prompts) != len(slots) or any(len(p) < 2 for p in prompts):
            raise ValueError("prefill: one prompt of at least 2 bytes per slot")
        counts = np.array([len(p) - 1 for p in prompts])
        tokens = np.zeros((len(prompts), counts.max()), dtype=np.int64)
        for row, p in enumerate(prompts):
            tokens[row, : len(p) - 1] = np.frombuffer(p[:-1], dtype=np.uint8)
        s = self._t(slots)
        self.cache.truncate(s, torch.zeros_like(s))
        _, hidden = self.models.target.extend(self.cache, s, self._t(tokens), self._t(counts))
        rows = torch.arange(len(slots), device=self.device)
        self.hidden[s] = round_logits(hidden[rows, self._t(counts - 1)])
        self.last[slots] = [p[-1] for p in prompts]

    @torch.no_grad()
    def draft(self, slots: np.ndarray, temperature: np.ndarray, uniforms: np.ndarray) -> Drafted:
        """A block per row: greedy where `temperature == 0`, else sampled at it by inverse CDF
        with the caller's `uniforms [B, gamma]` in [0, 1)."""
        s = self._t(slots)
        block = self.models.drafter.draft(
            self.hidden[s],
            self._t(self.last[slots]),
            torch.as_tensor(temperature, dtype=self.dtype, device=self.device),
            torch.as_tensor(uniforms, dtype=self.dtype, device=self.device),
        )
        conf = self.models.confidence(block)
        return Drafted(
            block.tokens.cpu().numpy(),
            round_logits(block.logprobs).cpu().numpy(),
            round_logits(conf).cpu().numpy(),
        )

    @torch.no_grad()
    def verify(self, slots: np.ndarray, drafts: np.ndarray, window: np.ndarray) -> np.ndarray:
        """The target's logits `[B, 1 + window.max(), 256]` after the last committed token and
        each of the first `window` drafts; a row's columns past its window are padding."""
        window = np.asarray(window, dtype=np.int64)
        if (window < 0).any() or (window > drafts.shape[1]).any():
            raise ValueError(f"verify: windows must lie in [0, {drafts.shape[1]}]")
        width = 1 + int(window.max(initial=0))
        tokens = np.concatenate([self.last[slots][:, None], drafts[:, : width - 1]], axis=1)
        s = self._t(slots)
        start = self.cache.length[s].clone()
        logits, hidden = self.models.target.extend(
            self.cache, s, self._t(tokens), self._t(window + 1)
        )
        self._verified = (np.array(slots), start, round_logits(hidden))
        return round_logits(logits).cpu().numpy()

    def commit(self, slots: np.ndarray, accepted: np.ndarray, bonus: np.ndarray) -> None:
        """After `verify` on the same slots: keep the last token and `accepted` drafts in each
        cache, and make `bonus` the token the next draft starts after."""
        if self._verified is None or not np.array_equal(self._verified[0], slots):
            raise ValueError("commit: call verify on the same slots first")
        _, start, hidden = self._verified
        self._verified = None
        acc = self._t(accepted)
        self.cache.truncate(self._t(slots), start + 1 + acc)
        self.hidden[self._t(slots)] = hidden[torch.arange(len(slots), device=self.device), acc]
        self.last[slots] = bonus
