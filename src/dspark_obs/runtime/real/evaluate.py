"""What the real world's models are measured by: held-out bits per byte, the drafter's survival
along the block, and the confidence head's calibration.

Acceptance is speculative decoding's own rule. A block is drafted from the target's hidden
state at the end of a context, then the target runs once over context + block: greedy, a
drafted token is accepted iff it is the target's argmax there; sampled at temperature T, with
probability min(1, p_T(x) / q_T(x)). Both are conditional on the block's earlier tokens, so
the chance the block survives to position i is the product of the first i.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ...calibration import brier_score, expected_calibration_error
from .model import DraftBlock
from .weights import RealModels


def as_tokens(data: bytes, device: str | torch.device = "cpu") -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device, torch.int64)


def windows(data: bytes, context: int) -> list[bytes]:
    """The text cut into consecutive windows of `context` bytes (the last may be shorter; one
    of a single byte predicts nothing and is dropped)."""
    cuts = [data[i : i + context] for i in range(0, len(data), context)]
    return [w for w in cuts if len(w) >= 2]


@torch.no_grad()
def bits_per_byte(models: RealModels, data: bytes, context: int, limit: int | None = None) -> float:
    """Mean next-byte loss in bits over `data` cut into `windows`, each read from its start
    by the full causal forward (the first `limit` windows only, when given)."""
    p = next(models.target.parameters())
    nats, count = 0.0, 0
    cut = windows(data, context)[:limit]
    by_length: dict[int, list[bytes]] = {}
    for w in cut:
        by_length.setdefault(len(w), []).append(w)
    for group in by_length.values():
        x = torch.stack([as_tokens(w, p.device) for w in group])
        logits, _ = models.target(x[:, :-1])
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
        )
        nats += float(loss)
        count += x[:, 1:].numel()
    return nats / count / math.log(2)


def anchor_contexts(data: bytes, length: int, stride: int, device) -> torch.Tensor:
    """`[n, length]` contexts ending every `stride` bytes of the text: where blocks are drafted."""
    x = as_tokens(data, device)
    return x.unfold(0, length, stride)


def draft_and_verify(
    models: RealModels, contexts: torch.Tensor, temperature: torch.Tensor, gen: torch.Generator
) -> tuple[torch.Tensor, DraftBlock]:
    """Draft a block after each context and judge it: `(accept [B, gamma], block)`, `accept`
    the conditional acceptance probability of each drafted token (0 or 1 for greedy rows,
    `temperature == 0`)."""
    target, drafter = models.target, models.drafter
    gamma = drafter.gamma
    _, hidden = target(contexts[:, :-1])
    dtype = torch.promote_types(hidden.dtype, torch.float32)
    u = torch.rand((len(contexts), gamma), generator=gen, device=contexts.device, dtype=dtype)
    block = drafter.draft(hidden[:, -1], contexts[:, -1], temperature.to(dtype), u)
    logits, _ = target(torch.cat([contexts, block.tokens], dim=1))
    p = logits[:, -gamma - 1 : -1]
    greedy = (temperature <= 0)[:, None]
    temp = torch.where(greedy[:, 0], torch.ones_like(temperature), temperature)[:, None, None]
    p_logp = F.log_softmax(p / temp.to(p.dtype), dim=-1)
    chosen = block.tokens[..., None]
    ratio = (p_logp.gather(-1, chosen) - block.logprobs.gather(-1, chosen))[..., 0]
    sampled = ratio.clamp(max=0.0).exp()
    hit = (p.argmax(dim=-1) == block.tokens).to(sampled.dtype)
    return torch.where(greedy, hit, sampled), block


@torch.no_grad()
def survival_and_calibration(
    models: RealModels, contexts: torch.Tensor, temperature: float, seed: int, batch: int = 256
) -> dict:
    """Per-position survival, mean accepted, and the raw confidence head's ECE and Brier
    against drawn acceptances (one coin per sampled token) on the positions the chain reached."""
    gen = torch.Generator(device=contexts.device).manual_seed(seed)
    accepts, confs = [], []
    for start in range(0, len(contexts), batch):
        ctx = contexts[start : start + batch]
        temp = torch.full((len(ctx),), float(temperature), device=ctx.device)
        acc, block = draft_and_verify(models, ctx, temp, gen)
        accepts.append(acc.double().cpu().numpy())
        confs.append(torch.sigmoid(models.confidence(block)).double().cpu().numpy())
    acc, conf = np.concatenate(accepts), np.concatenate(confs)
    coins = np.random.default_rng(seed).random(acc.shape) < acc
    reached = np.cumprod(np.concatenate([np.ones((len(acc), 1), bool), coins[:, :-1]], 1), 1) > 0
    survival = np.cumprod(acc, axis=1).mean(axis=0)
    return {
        "anchors": len(acc),
        "survival": [round(float(s), 4) for s in survival],
        "mean_accepted": round(float(survival.sum()), 4),
        "confidence_ece": round(expected_calibration_error(conf[reached], coins[reached]), 4),
        "confidence_brier": round(brier_score(conf[reached], coins[reached]), 4),
    }
