"""The one place figures are made and embedded, so report, compare and dashboard renders look alike.

Colours and styles are `palette`'s; this module makes, lays out and embeds figures, and
writes their tick labels as `numbers` writes every other number (`30,564`, not `30564`,
`3e4` or `2^5`).

Figures are `matplotlib.figure.Figure` objects on the Agg canvas, never pyplot:
no global state, no display needed, safe in threads and in CI. PNGs embed in
HTML as base64 data URIs so a report opens offline from a single file.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from matplotlib.ticker import Formatter

from .numbers import number
from .outputs import write_file

#: Default size of a single-panel figure, inches at `DPI`.
WIDTH, HEIGHT, DPI = 8.0, 4.8, 100

#: Most batch sizes labelled on a batch-size axis; more are thinned evenly.
MAX_BATCH_TICKS = 10


def new_figure(width: float = WIDTH, height: float = HEIGHT):
    """A blank Agg figure with constrained layout (labels never clip at 100%)."""
    import matplotlib

    matplotlib.use("Agg")
    # labels carry names from clients, and `$x^{$-3` read as mathtext fails the whole
    # figure; no figure of ours writes mathtext, so a `$` is always a dollar sign
    matplotlib.rcParams["text.parse_math"] = False
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def legend_outside(
    target, handles=None, labels=None, *, title: str | None = None, where: str = "upper"
):
    """A legend beside the data, never over it: right of one axes, or of a whole figure
    (`where`: its upper or lower right, so a figure can carry a key beside its legend).

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
    return target.legend(*args, loc=f"outside right {where}", **kw)


class NumberTicks(Formatter):
    """Tick labels by `numbers.number`, with the fewest decimals that write every tick exactly."""

    def format_ticks(self, values):
        digits = next((d for d in range(7) if all(_exact(v, d) for v in values)), 6)
        return [number(float(v), digits) for v in values]

    def __call__(self, x, pos=None):
        return self.format_ticks([x])[0]


def _exact(value: float, digits: int) -> bool:
    return abs(value - round(value, digits)) <= 1e-9 * max(1.0, abs(value))


def number_ticks(fig) -> None:
    """`NumberTicks` on every numeric axis of `fig` still on matplotlib's default formatter;
    a decimal log axis ticks at 1, 2 and 5 of each decade, so one or two decades still read.

    `save_png` runs it, because setting an axis' scale puts the default formatter back and
    figures set scales up to the end; axes of dates, categories or a chosen formatter keep
    theirs.
    """
    from matplotlib.ticker import LogFormatter, LogLocator, NullFormatter, ScalarFormatter

    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            default = axis.get_major_formatter()
            if isinstance(default, LogFormatter) and axis.get_transform().base == 10:
                axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
                axis.set_minor_formatter(NullFormatter())
            elif not isinstance(default, ScalarFormatter):
                continue
            axis.set_major_formatter(NumberTicks())


def batch_size_axis(ax, sizes) -> None:
    """A log-2 x axis ticked at the batch sizes drawn, not at 2^k (thinned evenly past
    `MAX_BATCH_TICKS`)."""
    from matplotlib.ticker import FixedLocator, NullLocator

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sorted(set(sizes)), nbins=MAX_BATCH_TICKS))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(NumberTicks())


def save_png(fig, path: str | Path, dpi: int = DPI) -> Path:
    """Write `fig` as PNG on a white background, its ticks by `number_ticks`; return the path.

    OutputRefused where `path` is a symbolic link."""
    number_ticks(fig)
    # through `outputs.write_file`: never through a planted link, never half a PNG
    return write_file(
        path, lambda f: fig.savefig(f, format="png", facecolor="white", dpi=dpi), durable=False
    )


def img_tag(path: str | Path, alt: str) -> str:
    """An `<img>` whose PNG is inlined as a data URI."""
    b64 = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img src="data:image/png;base64,{b64}" alt="{html.escape(alt)}">'
