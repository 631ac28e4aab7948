"""The three networks in one small file: int8 matrices with a scale per row, the rest float32.

Committed weights must stay small (all three under 8 MB), so every matrix of at least
`_QUANTIZE_MIN` entries is stored as int8 with one float32 scale per output row (symmetric:
the row's largest magnitude maps to 127); norms, biases and small tables stay float32. A
loader dequantizes, so every figure recorded for the weights is measured on what `load`
returns, never on the float weights training ended with. The file is a numpy `.npz` read
with `allow_pickle=False`: loading it runs no code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from . import DEFAULT_WEIGHTS
from .model import BlockDrafter, ConfidenceHead, ModelConfig, TargetLM

_QUANTIZE_MIN = 4096
_PARTS = ("target", "drafter", "confidence")


@dataclass
class RealModels:
    """The loaded networks, in eval mode, on one device and dtype."""

    config: ModelConfig
    target: TargetLM
    drafter: BlockDrafter
    confidence: ConfidenceHead

    def modules(self) -> dict[str, torch.nn.Module]:
        return dict(zip(_PARTS, (self.target, self.drafter, self.confidence), strict=True))


def build(config: ModelConfig) -> RealModels:
    return RealModels(config, TargetLM(config), BlockDrafter(config), ConfidenceHead(config))


def save(models: RealModels, path: str | Path) -> None:
    arrays: dict[str, np.ndarray] = {
        "config": np.frombuffer(json.dumps(models.config.to_dict()).encode(), dtype=np.uint8)
    }
    for part, module in models.modules().items():
        for name, t in module.state_dict().items():
            a = t.detach().to("cpu", torch.float32).numpy()
            key = f"{part}/{name}"
            if a.ndim == 2 and a.size >= _QUANTIZE_MIN:
                scale = np.abs(a).max(axis=1, keepdims=True) / 127.0
                scale[scale == 0] = 1.0
                arrays[key + ".q"] = np.round(a / scale).astype(np.int8)
                arrays[key + ".scale"] = scale.astype(np.float32)
            else:
                arrays[key] = a
    with open(path, "wb") as f:
        np.savez_compressed(f, **arrays)


def load(
    path: str | Path = DEFAULT_WEIGHTS,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float64,
) -> RealModels:
    """The dequantized networks; a missing or malformed file is a ValueError naming it."""
    try:
        with np.load(path, allow_pickle=False) as z:
            stored = {k: z[k] for k in z.files}
        config = ModelConfig(**json.loads(stored.pop("config").tobytes()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a real-models weights file ({exc})") from exc
    models = build(config)
    for part, module in models.modules().items():
        state = {}
        for name in module.state_dict():
            key = f"{part}/{name}"
            if key + ".q" in stored:
                a = stored[key + ".q"].astype(np.float32) * stored[key + ".scale"]
            elif key in stored:
                a = stored[key]
            else:
                raise ValueError(f"{path}: {key} is missing")
            state[name] = torch.from_numpy(np.ascontiguousarray(a))
        module.load_state_dict(state)
        module.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return models
