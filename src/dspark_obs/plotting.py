"""The one place figures are made and embedded, so report, compare and dashboard renders look alike.

Colours and styles are `palette`'s; this module makes, lays out and embeds figures.

Figures are `matplotlib.figure.Figure` objects on the Agg canvas, never pyplot:
no global state, no display needed, safe in threads and in CI. PNGs embed in
HTML as base64 data URIs so a report opens offline from a single file.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

#: Default size of a single-panel figure, inches at `DPI`.
WIDTH, HEIGHT, DPI = 8.0, 4.8, 100


def new_figure(width: float = WIDTH, height: float = HEIGHT):
    """A blank Agg figure with constrained layout (labels never clip at 100%)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def legend_outside(target, handles=None, labels=None, *, title: str | None = None):
    """A legend beside the data, never over it: right of one axes, or of a whole figure.

    Constrained layout makes room for it, so the plot shrinks rather than the
    legend covering bars or lines.
    """
    from matplotlib.axes import Axes

    kw = {"fontsize": "small", "title": title, "title_fontsize": "small", "frameon": False}
    args = () if handles is None else (handles, labels)
    if isinstance(target, Axes):
        return target.legend(
            *args, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw
        )
    return target.legend(*args, loc="outside right upper", **kw)


def save_png(fig, path: str | Path, dpi: int = DPI) -> Path:
    """Write `fig` as PNG on a white background and return the path."""
    path = Path(path)
    fig.savefig(path, format="png", facecolor="white", dpi=dpi)
    return path


def img_tag(path: str | Path, alt: str) -> str:
    """An `<img>` whose PNG is inlined as a data URI."""
    b64 = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{b64}" alt="{html.escape(alt)}">'
