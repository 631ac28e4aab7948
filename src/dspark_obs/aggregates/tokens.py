"""Token accounting per group: windows, accepted, committed and ceiling distributions.

Everything is an integer histogram over 0..gamma(+1), so means, sums, trimmed
tokens and utilisation all follow exactly from the histograms, and Prometheus
gets integer-bucket histograms without a second pass.
"""

from __future__ import annotations

import numpy as np

from .rows import RequestRows, compiled_fold
from .window import WindowedSums

#: Histograms kept per group, in column order, with their value range (gamma + extra).
HISTOGRAMS = (
    ("window", 1),  # drafts verified, 0..gamma
    ("accepted", 1),  # drafts accepted, 0..gamma
    ("committed", 2),  # tokens committed (accepted + bonus), 0..gamma+1
    ("ceiling_observed", 1),  # ceiling from static / cap-accept rows
    ("ceiling_shadow", 1),  # ceiling from a cap-accept shadow twin
    ("accepted_known", 1),  # accepted, on rows whose ceiling is known
)


def histogram_slices(gamma: int) -> dict[str, slice]:
    """Column range of each histogram in a group's row."""
    out, col = {}, 0
    for name, extra in HISTOGRAMS:
        out[name] = slice(col, col + gamma + extra)
        col += gamma + extra
    return out


class TokenAggregate:
    def __init__(
        self, gamma: int, window_steps: int, segments: int, compiled: bool | None = None
    ) -> None:
        self.gamma = gamma
        self.slices = histogram_slices(gamma)
        width = max(s.stop for s in self.slices.values())
        self.sums = WindowedSums(width, window_steps, segments, dtype=np.int64)
        self._starts = tuple(self.slices[name].start for name, _ in HISTOGRAMS)
        self._fold = compiled_fold(compiled)

    def update(self, rows: RequestRows) -> None:
        """Rows of validated batches (values within their histogram's range)."""
        if self._fold is not None:
            self._fold.tokens(
                self.sums.current,
                self.sums.width,
                self._starts,
                rows.batches,
                rows.modes,
                rows.group,
            )
            return
        at = {name: sl.start for name, sl in self.slices.items()}
        base = rows.group * self.sums.width
        observed = rows.ceiling >= 0
        shadow_only = (rows.shadow >= 0) & ~observed
        index = np.concatenate(
            [
                base + (rows.window + at["window"]),
                base + (rows.accepted + at["accepted"]),
                base + (rows.committed + at["committed"]),
                np.compress(observed, base + (rows.ceiling + at["ceiling_observed"])),
                np.compress(shadow_only, base + (rows.shadow + at["ceiling_shadow"])),
                np.compress(observed | shadow_only, base + (rows.accepted + at["accepted_known"])),
            ]
        )
        self.sums.add_flat(index)
