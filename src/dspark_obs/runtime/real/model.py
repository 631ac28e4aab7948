"""The real world's networks: a byte-level target LM, a DSpark block drafter, a confidence head.

The target is a small pre-norm causal transformer with rotary positions (no learned position
table, so a context longer than the trained one still runs, only less well). It has two
forwards: a full causal one over whole sequences (training, held-out loss) and an incremental
one over a `KVCache` of request slots, which is what a runtime uses: prefill a prompt, then
each step verify the last committed token and the drafted window, keep the accepted prefix
(`KVCache.truncate`). Both return the last layer's normalised hidden states beside the logits,
because the drafter starts from them.

The drafter is DSpark's: ONE forward from the target's hidden state at the last position the
target has seen, plus the one committed token it has not seen yet, gives features for all
gamma positions and their base logits; a Markov head adds, at position i, a term computed from
that position's features and the token drafted at i-1 (a table lookup and one small matrix
product), so drafting the block is gamma cheap steps after one forward. The confidence head
turns position i's features, the drafted token and its draft probability into a raw logit of
acceptance, which STS then calibrates per position as for any head.

Batch invariance (compact and cap-accept must commit the same tokens): every row's result
must not depend on which other rows share the forward. A runtime runs these modules in
float64 and rounds what it reads to float32 (`round_logits`): summation order may change the
last float64 bits with the batch's shape, and such a change reaches the float32 value only
when it straddles a rounding boundary (about one value in 1e8).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

#: bytes are the vocabulary; byte 0 never occurs in the texts and ends a document (it is
#: also the runtime's EOS token id)
VOCAB = 256
EOT = 0


@dataclass(frozen=True)
class ModelConfig:
    """The sizes of all three networks (stored beside their weights)."""

    layers: int = 4
    width: int = 256
    heads: int = 4
    context: int = 1024
    gamma: int = 7
    drafter_blocks: int = 3
    markov_width: int = 256
    confidence_width: int = 64

    def to_dict(self) -> dict:
        return asdict(self)


def round_logits(x: torch.Tensor) -> torch.Tensor:
    """float64 rounded through float32: the batch-invariant value a runtime reads."""
    return x.to(torch.float32).to(torch.float64)


def _rope(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """Rotary position on `x [B, H, T, hd]` at integer positions `pos [B, T]`."""
    half = x.shape[-1] // 2
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64, device=x.device) / half)
    ang = pos.to(torch.float64)[:, None, :, None] * inv
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.ln2 = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)

    def qkv_heads(self, x: torch.Tensor, pos: torch.Tensor):
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
            for z in self.qkv(self.ln1(x)).split(c, dim=-1)
        )
        return _rope(q, pos), _rope(k, pos), v

    def finish(self, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        b, _, t, _ = att.shape
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, -1))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class KVCache:
    """Keys and values of a fixed set of request slots, and how many positions each holds.

    Tensors are `[layers, slots, heads, capacity, head_dim]`; capacity doubles when a
    forward needs more. Positions past a slot's length are stale and never read.
    """

    def __init__(self, model: TargetLM, slots: int, capacity: int = 256) -> None:
        p = next(model.parameters())
        c = model.config
        self.shape = (c.layers, slots, c.heads, capacity, c.width // c.heads)
        self.k = torch.zeros(self.shape, dtype=p.dtype, device=p.device)
        self.v = torch.zeros_like(self.k)
        self.length = torch.zeros(slots, dtype=torch.int64, device=p.device)

    def ensure(self, needed: int) -> None:
        cap = self.k.shape[3]
        if needed <= cap:
            return
        while cap < needed:
            cap *= 2
        grow = list(self.k.shape)
        grow[3] = cap - self.k.shape[3]
        self.k = torch.cat([self.k, self.k.new_zeros(grow)], dim=3)
        self.v = torch.cat([self.v, self.v.new_zeros(grow)], dim=3)

    def truncate(self, slots: torch.Tensor, lengths: torch.Tensor) -> None:
        """Keep the first `lengths` positions of `slots` (never more than they hold)."""
        if bool((lengths > self.length[slots]).any()) or bool((lengths < 0).any()):
            raise ValueError("truncate: a length beyond what the slot holds, or negative")
        self.length[slots] = lengths


def _placement(cache: KVCache, slots: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor):
    """Where a forward appending `counts[b]` of `tokens [B, T]` to each slot puts them: their
    positions `[B, T]`, the slots' new lengths, the longest, the valid tokens' (row, column),
    their cache addresses, and the causal mask over the cache; the cache grown to fit."""
    start = cache.length[slots]
    steps = torch.arange(tokens.shape[1], device=tokens.device)
    pos = start[:, None] + steps
    total = start + counts
    width = int(total.max())
    cache.ensure(width)
    row, col = torch.nonzero(steps[None, :] < counts[:, None], as_tuple=True)
    where = (slots[row], pos[row, col])
    mask = torch.arange(width, device=tokens.device)[None, None, :] <= pos[:, :, None]
    return pos, total, width, row, col, where, mask


class TargetLM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(VOCAB, config.width)
        self.blocks = nn.ModuleList(
            _Block(config.width, config.heads) for _ in range(config.layers)
        )
        self.ln_f = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Full causal forward over `tokens [B, T]` from position 0: `(logits, hidden)`."""
        b, t = tokens.shape
        pos = torch.arange(t, device=tokens.device).expand(b, t)
        x = self.embed(tokens)
        for blk in self.blocks:
            q, k, v = blk.qkv_heads(x, pos)
            x = blk.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))
        h = self.ln_f(x)
        return self.head(h), h

    def extend(
        self, cache: KVCache, slots: torch.Tensor, tokens: torch.Tensor, counts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `counts[b]` of the tokens `[B, T]` to slot `slots[b]`, attending to its cache.

        Returns `(logits, hidden)` `[B, T, ...]`; columns at or past a row's count are padding
        whose outputs mean nothing. The slots' lengths grow by their counts.
        """
        pos, total, width, row, col, where, mask = _placement(cache, slots, tokens, counts)
        x = self.embed(tokens)
        for layer, blk in enumerate(self.blocks):
            q, k, v = blk.qkv_heads(x, pos)
            cache.k[layer][where[0], :, where[1]] = k.transpose(1, 2)[row, col]
            cache.v[layer][where[0], :, where[1]] = v.transpose(1, 2)[row, col]
            keys = cache.k[layer][slots, :, :width]
            values = cache.v[layer][slots, :, :width]
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None])
            x = blk.finish(x, att)
        cache.length[slots] = total
        h = self.ln_f(x)
        return self.head(h), h

    def extend_packed(
        self,
        cache: KVCache,
        slots: torch.Tensor,
        tokens: torch.Tensor,
        counts: torch.Tensor,
        padded: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`extend` as a server's verify runs it: the rows' tokens packed one after another
        and padded to `padded` (a captured CUDA-graph tier), so the projections, the MLPs
        and the head cost what the packed count rounded up to its tier costs, and each
        row's attention reads its own cache. Returns `(logits, hidden)` `[padded, ...]` in
        packed order (row by row, each row's first `counts[b]` tokens); past them, padding.
        """
        b, t = tokens.shape
        n = int(counts.sum())
        if padded < n:
            raise ValueError(f"extend_packed: {n} tokens do not fit in {padded}")
        pos, total, width, row, col, where, mask = _placement(cache, slots, tokens, counts)
        flat = tokens.new_zeros(padded)
        flat[:n] = tokens[row, col]
        flat_pos = pos.new_zeros((1, padded))
        flat_pos[0, :n] = pos[row, col]
        x = self.embed(flat)[None]
        for layer, blk in enumerate(self.blocks):
            q, k, v = blk.qkv_heads(x, flat_pos)
            cache.k[layer][where[0], :, where[1]] = k[0].transpose(0, 1)[:n]
            cache.v[layer][where[0], :, where[1]] = v[0].transpose(0, 1)[:n]
            rect = q.new_zeros((b, q.shape[1], t, q.shape[3]))
            rect[row, :, col] = q[0].transpose(0, 1)[:n]
            keys = cache.k[layer][slots, :, :width]
            values = cache.v[layer][slots, :, :width]
            att = F.scaled_dot_product_attention(rect, keys, values, attn_mask=mask[:, None])
            out = q.new_zeros((padded, q.shape[1], q.shape[3]))
            out[:n] = att[row, :, col]
            x = blk.finish(x, out.transpose(0, 1)[None])
        cache.length[slots] = total
        h = self.ln_f(x[0])
        return self.head(h), h


class _Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.ln(x))))


@dataclass
class DraftBlock:
    """One drafted block per row: tokens `[B, gamma]`, the draft's log-probabilities
    `[B, gamma, V]` at the row's temperature (greedy rows: at 1) and the confidence head's
    inputs."""

    tokens: torch.Tensor
    logprobs: torch.Tensor
    features: torch.Tensor
    markov: torch.Tensor


class BlockDrafter(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        w, r = config.width, config.markov_width
        self.gamma = config.gamma
        self.ln_in = nn.LayerNorm(w)
        self.last = nn.Embedding(VOCAB, w)
        self.position = nn.Parameter(torch.zeros(config.gamma, w))
        self.trunk = nn.Sequential(*(_Residual(w) for _ in range(config.drafter_blocks)))
        self.ln_out = nn.LayerNorm(w)
        self.head = nn.Linear(w, VOCAB, bias=False)
        self.markov_in = nn.Linear(w, r)
        self.markov_prev = nn.Embedding(VOCAB, r)
        self.markov_out = nn.Linear(r, VOCAB, bias=False)

    def features(self, hidden: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The one forward: `[B, gamma, width]` from the target's hidden `[B, width]` at the
        last position it has run and the committed token `last [B]` it has not."""
        x = (self.ln_in(hidden) + self.last(last))[:, None, :] + self.position
        return self.ln_out(self.trunk(x))

    def markov_hidden(self, feats: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """The Markov head's hidden at positions `feats [..., width]` given previous tokens."""
        return F.gelu(self.markov_in(feats) + self.markov_prev(prev))

    def logits(self, feats: torch.Tensor, prev: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft logits and Markov hidden, teacher-forced: `prev [B, gamma]` the tokens before."""
        m = self.markov_hidden(feats, prev)
        return self.head(feats) + self.markov_out(m), m

    def draft(
        self,
        hidden: torch.Tensor,
        last: torch.Tensor,
        temperature: torch.Tensor,
        uniforms: torch.Tensor,
    ) -> DraftBlock:
        """Draft gamma tokens per row: argmax where `temperature[b] == 0`, else an inverse-CDF
        draw at that temperature with the caller's `uniforms [B, gamma]` in [0, 1)."""
        feats = self.features(hidden, last)
        base = self.head(feats)
        pre = self.markov_in(feats)
        greedy = temperature <= 0
        temp = torch.where(greedy, torch.ones_like(temperature), temperature)[:, None]
        prev = last
        tokens, logps, marks = [], [], []
        for i in range(self.gamma):
            m = F.gelu(pre[:, i] + self.markov_prev(prev))
            logp = F.log_softmax((base[:, i] + self.markov_out(m)) / temp, dim=-1)
            cdf = logp.exp().cumsum(dim=-1)
            drawn = (cdf <= (uniforms[:, i] * cdf[:, -1])[:, None]).sum(dim=-1)
            prev = torch.where(greedy, logp.argmax(dim=-1), drawn.clamp(max=VOCAB - 1))
            tokens.append(prev)
            logps.append(logp)
            marks.append(m)
        return DraftBlock(
            torch.stack(tokens, 1), torch.stack(logps, 1), feats, torch.stack(marks, 1)
        )


class ConfidenceHead(nn.Module):
    """Raw acceptance logit of each drafted token from what the drafter knew when drafting it:
    its features, its Markov hidden, the token's draft log-probability and the draft's entropy."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config.confidence_width
        self.net = nn.Sequential(
            nn.Linear(config.width + config.markov_width + 2, c),
            nn.GELU(),
            nn.Linear(c, c),
            nn.GELU(),
            nn.Linear(c, 1),
        )

    def forward(self, block: DraftBlock) -> torch.Tensor:
        logp = block.logprobs
        chosen = logp.gather(-1, block.tokens[..., None])
        entropy = -(logp.exp() * logp).sum(dim=-1, keepdim=True)
        x = torch.cat([block.features, block.markov, chosen, entropy], dim=-1)
        return self.net(x)[..., 0]
