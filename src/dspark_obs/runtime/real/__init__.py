"""The real world's models: a byte-level target LM trained on the Python standard library's
own text, a DSpark block drafter and a confidence head, with their committed weights and
held-out samples (docs/runtime.md, "The real world's models")."""

from pathlib import Path

#: the committed weights of all three networks (`weights.py` reads them); named here, where
#: nothing imports torch, so looking up the shipped STS fit by their hash does not load it
DEFAULT_WEIGHTS = Path(__file__).parent / "data" / "real-models.npz"
