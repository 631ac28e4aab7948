"""A torch network as the target, so that step times are measured, not simulated.

The network maps the context (previous two tokens, a hashed request/position
bucket) to base logits; the workload shaping of `SyntheticTarget` (scale, peak
token, EOS) is applied on top, so difficulty per workload is the same as with
the hash target. Each step the runtime runs one real verify forward over the
packed verify tokens, padded to the captured tier, and times it: the verify
cost then genuinely grows with the window the scheduler chose.

Base logits are computed in float64 and rounded, so that the same context gives
the same distribution whatever batch it is computed in (BLAS blocking can change
the last bits): compact and cap-accept stay in lockstep.
"""

from __future__ import annotations

import time

import numpy as np

from .hashing import extend
from .language import SyntheticTarget, WorkloadProfile

_BUCKETS = 8192
_TAG_BUCKET = 61


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ValueError("the torch target needs torch: pip install 'dspark-obs[torch]'") from exc
    return torch


class TorchTarget(SyntheticTarget):
    measured = True

    def __init__(
        self,
        workloads: list[WorkloadProfile],
        vocab_size: int,
        seed: int,
        hidden: int = 512,
        layers: int = 2,
        device: str | None = None,
    ) -> None:
        super().__init__(workloads, vocab_size, seed)
        torch = self.torch = _torch()
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        g = torch.Generator().manual_seed(int(seed) & 0x7FFFFFFF)
        kw = {"generator": g, "dtype": torch.float64}
        scale = hidden**-0.5
        params = {
            "prev1": torch.randn(vocab_size, hidden, **kw),
            "prev2": torch.randn(vocab_size, hidden, **kw),
            "bucket": torch.randn(_BUCKETS, hidden, **kw),
            "layers": [torch.randn(hidden, hidden, **kw) * scale for _ in range(layers)],
            "out": torch.randn(hidden, vocab_size, **kw) * scale,
        }
        self.params = {
            k: [t.to(self.device) for t in v] if isinstance(v, list) else v.to(self.device)
            for k, v in params.items()
        }
        self.description = f"torch MLP target, hidden {hidden}, {layers} layers, {self.device}"

    def _forward(self, position_key, prev2, prev1):
        torch, p = self.torch, self.params
        bucket = (extend(position_key, _TAG_BUCKET) % np.uint64(_BUCKETS)).astype(np.int64)
        idx = [
            torch.from_numpy(np.ascontiguousarray(a)).to(self.device)
            for a in (prev1, prev2, bucket)
        ]
        x = p["prev1"][idx[0]] + p["prev2"][idx[1]] + p["bucket"][idx[2]]
        for w in p["layers"]:
            x = x + torch.nn.functional.gelu(x @ w)
        out = x @ p["out"]
        return (out - out.mean(dim=1, keepdim=True)) / out.std(dim=1, keepdim=True)

    def logits_at(self, position_key, prev2, prev1, workload):
        with self.torch.no_grad():
            base = self._forward(position_key, prev2, prev1).cpu().numpy()
        key = extend(position_key, prev2, prev1)
        return self.shape(key, np.round(base, 6), workload)

    def timed_verify(self, position_key, prev2, prev1, padded_rows: int) -> float:
        """Seconds of one verify forward over the packed contexts, padded to `padded_rows`."""
        pad = padded_rows - len(position_key)
        if pad > 0:
            position_key, prev2, prev1 = (
                np.concatenate([a, np.repeat(a[-1:], pad)]) for a in (position_key, prev2, prev1)
            )
        torch = self.torch
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        with torch.no_grad():
            sync()
            start = time.perf_counter()
            self._forward(position_key, prev2, prev1)
            sync()
        return time.perf_counter() - start
