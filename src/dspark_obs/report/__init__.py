"""Run reports: figures and the pages that embed them.

`build` writes a report from runs (`arms` analyses each run, `sections` builds each section,
`figure_queue` draws the figures, `figures` holds the drawings, `document` the page formats).
"""

from .build import build_report, overlay_figures
from .sections import context_tables, cost_quality_table

__all__ = [
    "build_report",
    "context_tables",
    "cost_quality_table",
    "overlay_figures",
]
