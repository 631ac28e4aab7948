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
must not depend on which other rows share the forward. Two precisions keep it, one per kind
of device:

- on an accelerator the modules run in float64 and a runtime rounds what it reads to
  float32 (`round_logits`): summation order may change the last float64 bits with the
  batch's shape, and such a change reaches the float32 value only when it straddles a
  rounding boundary (about one value in 1e8);
- on a CPU they run in float32 (twice the float64 products' speed, half their memory), where
  a matrix product's row is the same bits whatever the other rows, once the product has a
  multiple of `ROW_TILE` rows (BLAS takes other paths for a few rows: a row of a 3-row
  product differs in its last bits from the same row among 16). So every product of an
  incremental forward or a draft is padded to that many rows, and attention runs row by row
  (`SlotCache`, which holds the keys and values in float16: `cache_dtype`);
  `tests/test_real_models.py` checks the invariance on the machine it runs on.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import asdict, dataclass

import numpy as np
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


#: products of an incremental forward or a draft have a multiple of this many rows (see above)
ROW_TILE = 16


def round_logits(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded through float32, in its own dtype (float32 values as they are): the
    batch-invariant value a runtime reads."""
    return x.to(torch.float32).to(x.dtype)


def tiled(n: int) -> int:
    """`n` rows padded up to a multiple of `ROW_TILE` (at least one tile)."""
    return max(1, -(-n // ROW_TILE)) * ROW_TILE


def _rotation(pos: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary position's float64 `(cos, sin)` at integer positions `pos`, shaped as `pos`
    with a last dimension of half a head: once a forward, since every layer rotates by them."""
    half = head_dim // 2
    inv = 10000.0 ** (-torch.arange(half, dtype=torch.float64, device=pos.device) / half)
    ang = pos.to(torch.float64)[..., None] * inv
    return ang.cos(), ang.sin()


def _rope(x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """`x [..., hd]` rotated by `_rotation`'s angles (broadcast to `x`), in `x`'s dtype."""
    cos, sin = (r.to(x.dtype) for r in rotation)
    half = x.shape[-1] // 2
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

    def qkv_heads(self, x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]):
        """Queries, keys and values `[B, H, T, hd]` of `x [B, T, C]` rotated by `rotation`
        (`_rotation` of positions `[B, 1, T]`)."""
        b, t, c = x.shape
        q, k, v = (
            z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
            for z in self.qkv(self.ln1(x)).split(c, dim=-1)
        )
        return _rope(q, rotation), _rope(k, rotation), v

    def project(self, x: torch.Tensor, rotation: tuple[torch.Tensor, torch.Tensor]):
        """Queries, keys and values `[N, H, hd]` of packed tokens `x [N, C]` rotated by
        `rotation` (`_rotation` of positions `[N, 1]`)."""
        n, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, 3, self.heads, c // self.heads).unbind(1)
        return _rope(q, rotation), _rope(k, rotation), v

    def finish(self, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """The residual stream after attention `att` (heads concatenated, `[..., C]`)."""
        x = x + self.proj(att)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


def _packing(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of each row's first `counts[b]` tokens, row after row."""
    row = np.repeat(np.arange(len(counts)), counts)
    return row, np.arange(len(row)) - np.repeat(np.cumsum(counts) - counts, counts)


class KVCache:
    """Keys and values of a fixed set of request slots, and how many positions each holds.

    A forward appending tokens opens with `begin` (where its tokens go), asks `attend` once a
    layer, and closes with `end` (the slots' new lengths). Positions past a slot's length are
    stale and never read. Two layouts, picked by `make_cache` for the device.
    """

    def __init__(self, model: TargetLM, slots: int) -> None:
        p = next(model.parameters())
        self.config = model.config
        self.device, self.dtype = p.device, p.dtype
        self.length = np.zeros(slots, dtype=np.int64)

    def truncate(self, slots: np.ndarray, lengths: np.ndarray) -> None:
        """Keep the first `lengths` positions of `slots` (never more than they hold)."""
        slots, lengths = np.asarray(slots), np.asarray(lengths)
        if (lengths > self.length[slots]).any() or (lengths < 0).any():
            raise ValueError("truncate: a length beyond what the slot holds, or negative")
        self.length[slots] = lengths

    def release(self, slots: np.ndarray) -> None:
        """Forget what `slots` hold (their requests finished); their next forward prefills."""
        self.length[np.asarray(slots)] = 0

    def begin(self, slots: np.ndarray, counts: np.ndarray) -> torch.Tensor:
        """Open a forward appending `counts[b]` tokens to slot `slots[b]`; the positions of
        those tokens, row after row (`[counts.sum()]`, on the device)."""
        self._slots, self._counts = np.asarray(slots), np.asarray(counts)
        self._start = self.length[self._slots]
        self._offsets = np.concatenate([[0], np.cumsum(self._counts)])
        self._row, self._col = _packing(self._counts)
        return torch.as_tensor(self._start[self._row] + self._col, device=self.device)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store the open forward's keys and values of `layer` and attend its queries: `q, k, v
        [M, H, hd]`, the first `counts.sum()` the rows' tokens in order, any further padding.
        Returns `[M, H * hd]`, zero at padding."""
        raise NotImplementedError

    def end(self) -> None:
        self.length[self._slots] = self._start + self._counts

    def save(self, slots: np.ndarray, start: np.ndarray, width: int):
        """The slots' lengths and their keys and values at positions `start` to `start +
        width`, which a forward from `start` overwrites (`restore` puts them back)."""
        raise NotImplementedError

    def restore(self, saved) -> None:
        raise NotImplementedError


def _mapped(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor on an anonymous private mapping of its own: its pages become resident
    when first written, and go back to the system when the tensor is freed."""
    if not hasattr(mmap, "MAP_PRIVATE"):  # no such mappings (Windows): the heap's
        return torch.zeros(shape, dtype=dtype)
    buf = mmap.mmap(-1, math.prod(shape) * dtype.itemsize, flags=mmap.MAP_PRIVATE)
    return torch.frombuffer(buf, dtype=dtype).view(shape)


def cache_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a `SlotCache` holds the keys and values of modules of `dtype` in: float16
    for float32 ones (a CPU run), their own otherwise.

    Keys and values are most of a CPU run's memory (128 requests of a few hundred positions:
    over 400 MB in float32). float16 halves them and keeps 11 significant bits, where
    bfloat16 keeps 8; its range (65,504) is far above what these networks produce (their
    largest key over the held-out texts is about 17, their largest value about 4); and the
    conversion to float32 before the products is exact and the same on every machine, so a
    row's numbers still depend on nothing else in the batch. Reading half the bytes, a CPU
    run's attention takes no more time for the conversion."""
    return torch.float16 if dtype == torch.float32 else dtype


def make_cache(model: TargetLM, slots: int) -> KVCache:
    """`SlotCache` on a CPU, `RectangleCache` on an accelerator."""
    device = next(model.parameters()).device
    return SlotCache(model, slots) if device.type == "cpu" else RectangleCache(model, slots)


class SlotCache(KVCache):
    """Each slot's keys and values in a tensor of its own, on a memory mapping of its own.

    Memory follows the tokens the slots hold, not slots times the longest of them (128 slots
    of up to 1,200 bytes padded to the longest, in float64, took gigabytes). A slot's mapping
    reserves `RESERVE` positions of address space, and a page of it becomes resident only
    when a token is first written there, so a slot costs what it holds (and at most a page
    per layer, key or value, and head beyond it) without being copied as it grows. A finished
    request's mapping goes back to the system at once (`release`, or the slot's next
    prefill). glibc's heap would keep it: the CLI raises the heap's mmap threshold above a
    slot's size (`allocator.py`), and slots of ever-changing sizes freed into the heap left a
    sixth of a run's resident memory as free holes.

    Attention runs row by row over the row's own positions: a row's scores and sums depend
    on nothing else in the batch, and no row reads another's padding. Keys and values are
    held in `held_as` (by default `cache_dtype`: float16 for a float32 run) and read back
    into the modules' dtype.
    """

    #: positions a new mapping reserves (4 MiB of address space at the shipped sizes in
    #: float16: a closed-loop request's whole context); a longer one moves to a mapping twice
    #: as long
    RESERVE = 1024

    def __init__(self, model: TargetLM, slots: int, held_as: torch.dtype | None = None) -> None:
        super().__init__(model, slots)
        c = self.config
        self._shape = (c.layers, 2, c.heads, c.width // c.heads)
        self.held_as = held_as or cache_dtype(self.dtype)
        self._store: list[torch.Tensor | None] = [None] * slots
        self._causal = torch.ones((0, 0), dtype=torch.bool)
        # the square root of attention's scale, applied to queries and keys apiece
        self._scale = math.sqrt(1 / math.sqrt(c.width // c.heads))

    def _reserve(self, slot: int, held: int, total: int) -> None:
        store = self._store[slot]
        if store is not None and total <= store.shape[3] and held > 0:
            return
        layers, kv, heads, hd = self._shape
        size = max(self.RESERVE, 1 << max(total - 1, 0).bit_length())
        grown = _mapped((layers, kv, heads, size, hd), self.held_as)
        if held:
            grown[:, :, :, :held] = store[:, :, :, :held]
        self._store[slot] = grown

    def release(self, slots: np.ndarray) -> None:
        super().release(slots)
        for s in np.asarray(slots).tolist():
            self._store[s] = None

    def _upper(self, count: int) -> torch.Tensor:
        """`[count, count]`, true above the diagonal: token i of a forward does not see the
        forward's tokens after it (a corner of one cached matrix)."""
        if count > self._causal.shape[0]:
            size = max(count, 2 * self._causal.shape[0], 16)
            self._causal = torch.ones((size, size), dtype=torch.bool).triu(1)
        return self._causal[:count, :count]

    def begin(self, slots: np.ndarray, counts: np.ndarray) -> torch.Tensor:
        pos = super().begin(slots, counts)
        self._rows = list(
            zip(
                self._slots.tolist(),
                self._start.tolist(),
                self._offsets[:-1].tolist(),
                self._offsets[1:].tolist(),
                strict=True,
            )
        )
        for slot, held, lo, hi in self._rows:
            self._reserve(slot, held, held + hi - lo)
        return pos

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """A row's attention is `scaled_dot_product_attention`'s own arithmetic on a CPU (its
        math path: queries and keys each scaled by the square root of the scale, their
        product, the causal mask, softmax, the product with the values) over the keys and
        values as held, with less around it: keys are stored already scaled, so a call does
        not scale the whole cache again, and only the forward's own columns are masked. Half
        the time of the library call on a row of a few hundred positions."""
        n = int(self._offsets[-1])
        qs = q[:n] * self._scale
        kv = torch.stack((k[:n] * self._scale, v[:n]), dim=1)
        out = []
        for slot, held, lo, hi in self._rows:
            store = self._store[slot][layer]
            total = held + hi - lo
            store[:, :, held:total] = kv[lo:hi].permute(1, 2, 0, 3)
            keys, values = store[:, :, :total].to(self.dtype).unbind(0)
            att = torch.matmul(qs[lo:hi].transpose(0, 1), keys.transpose(1, 2))
            if hi - lo > 1:
                att[:, :, held:].masked_fill_(self._upper(hi - lo), float("-inf"))
            out.append(torch.matmul(torch.softmax(att, -1), values).transpose(0, 1))
        att = torch.cat(out).flatten(1)
        if len(q) > n:
            att = torch.cat([att, att.new_zeros((len(q) - n, att.shape[1]))])
        return att

    def save(self, slots: np.ndarray, start: np.ndarray, width: int):
        slots = np.asarray(slots)
        kept = [
            self._store[s][:, :, :, a : a + width].clone()
            for s, a in zip(slots.tolist(), np.asarray(start).tolist(), strict=True)
        ]
        return slots, start, self.length[slots], kept

    def restore(self, saved) -> None:
        slots, start, length, kept = saved
        for s, a, t in zip(slots.tolist(), np.asarray(start).tolist(), kept, strict=True):
            self._store[s][:, :, :, a : a + t.shape[3]] = t
        self.length[slots] = length


class RectangleCache(KVCache):
    """Keys and values in one tensor `[layers, slots, heads, capacity, head_dim]` of the
    model's dtype; capacity doubles when a forward needs more. A layer's attention is one
    call over the rows' keys gathered up to the longest (masked past each row's own): on an
    accelerator one kernel a layer, where a loop over rows would be one launch a row."""

    def __init__(self, model: TargetLM, slots: int, capacity: int = 256) -> None:
        super().__init__(model, slots)
        c = self.config
        shape = (c.layers, slots, c.heads, capacity, c.width // c.heads)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros_like(self.k)

    def _ensure(self, needed: int) -> None:
        cap = self.k.shape[3]
        if needed <= cap:
            return
        while cap < needed:
            cap *= 2
        grow = list(self.k.shape)
        grow[3] = cap - self.k.shape[3]
        self.k = torch.cat([self.k, self.k.new_zeros(grow)], dim=3)
        self.v = torch.cat([self.v, self.v.new_zeros(grow)], dim=3)

    def begin(self, slots: np.ndarray, counts: np.ndarray) -> torch.Tensor:
        pos = super().begin(slots, counts)
        total = self._start + self._counts
        self._width = int(total.max())
        self._ensure(self._width)
        dev = self.device
        self._at = tuple(
            torch.as_tensor(a, device=dev) for a in (self._slots, self._row, self._col)
        )
        self._where = (self._at[0][self._at[1]], pos)
        steps = torch.arange(int(self._counts.max()), device=dev)
        last = torch.as_tensor(self._start, device=dev)[:, None] + steps
        self._mask = torch.arange(self._width, device=dev)[None, None, :] <= last[:, :, None]
        return pos

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        slots, row, col = self._at
        n = len(row)
        self.k[layer][self._where[0], :, self._where[1]] = k[:n]
        self.v[layer][self._where[0], :, self._where[1]] = v[:n]
        rect = q.new_zeros((len(slots), q.shape[1], self._mask.shape[1], q.shape[2]))
        rect[row, :, col] = q[:n]
        keys = self.k[layer][slots, :, : self._width]
        values = self.v[layer][slots, :, : self._width]
        att = F.scaled_dot_product_attention(rect, keys, values, attn_mask=self._mask[:, None])
        out = q.new_zeros(q.shape)
        out[:n] = att[row, :, col]
        return out.flatten(1)

    def save(self, slots: np.ndarray, start: np.ndarray, width: int):
        slots = np.asarray(slots)
        dev = self.device
        first = torch.as_tensor(start, device=dev)[:, None]
        at = (torch.as_tensor(slots, device=dev)[:, None], first + torch.arange(width, device=dev))
        kept = self.k[:, at[0], :, at[1]].clone(), self.v[:, at[0], :, at[1]].clone()
        return slots, self.length[slots], at, kept

    def restore(self, saved) -> None:
        slots, length, at, (k, v) = saved
        self.k[:, at[0], :, at[1]] = k
        self.v[:, at[0], :, at[1]] = v
        self.length[slots] = length


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
        hd = self.config.width // self.config.heads
        rotation = _rotation(torch.arange(t, device=tokens.device).expand(b, 1, t), hd)
        x = self.embed(tokens)
        for blk in self.blocks:
            q, k, v = blk.qkv_heads(x, rotation)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = blk.finish(x, att.transpose(1, 2).reshape(b, t, -1))
        h = self.ln_f(x)
        return self.head(h), h

    def _packed(
        self, cache: KVCache, slots: np.ndarray, counts: np.ndarray, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The incremental forward over packed `tokens [M]`: the rows' tokens, then padding."""
        pos = cache.begin(slots, counts)
        if len(tokens) > len(pos):
            pos = torch.cat([pos, pos.new_zeros(len(tokens) - len(pos))])
        hd = self.config.width // self.config.heads
        rotation = _rotation(pos[:, None], hd)
        x = self.embed(tokens)
        for layer, blk in enumerate(self.blocks):
            q, k, v = blk.project(x, rotation)
            x = blk.finish(x, cache.attend(layer, q, k, v))
        cache.end()
        h = self.ln_f(x)
        return self.head(h), h

    def extend(
        self, cache: KVCache, slots: np.ndarray, tokens: torch.Tensor, counts: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `counts[b]` of the tokens `[B, T]` to slot `slots[b]`, attending to its cache.

        Returns `(logits, hidden)` `[B, T, ...]`; columns at or past a row's count are padding
        (zero). The slots' lengths grow by their counts. Only the rows' tokens are computed,
        packed and padded to a multiple of `ROW_TILE`.
        """
        counts = np.asarray(counts)
        b, t = tokens.shape
        row, col = (torch.as_tensor(a, device=tokens.device) for a in _packing(counts))
        n = len(row)
        flat = tokens.new_zeros(tiled(n))
        flat[:n] = tokens[row, col]
        logits, hidden = self._packed(cache, slots, counts, flat)
        logits, hidden = logits[:n], hidden[:n]
        if n == b * t:
            return logits.view(b, t, -1), hidden.view(b, t, -1)
        out = logits.new_zeros((b, t, logits.shape[1])), hidden.new_zeros((b, t, hidden.shape[1]))
        out[0][row, col], out[1][row, col] = logits, hidden
        return out

    def extend_packed(
        self,
        cache: KVCache,
        slots: np.ndarray,
        tokens: torch.Tensor,
        counts: np.ndarray,
        padded: int,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`extend` as a server's verify runs it: the rows' tokens packed one after another
        and padded to `padded` (a captured CUDA-graph tier), so the projections, the MLPs
        and the head cost what the packed count rounded up to its tier costs, and each
        row's attention reads its own cache. Returns `(logits, hidden)` `[padded, ...]` in
        packed order (row by row, each row's first `counts[b]` tokens); past them, padding.
        """
        counts = np.asarray(counts)
        n = int(counts.sum())
        if padded < n:
            raise ValueError(f"extend_packed: {n} tokens do not fit in {padded}")
        row, col = (torch.as_tensor(a, device=tokens.device) for a in _packing(counts))
        flat = tokens.new_zeros(padded)
        flat[:n] = tokens[row, col]
        return self._packed(cache, slots, counts, flat)


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
