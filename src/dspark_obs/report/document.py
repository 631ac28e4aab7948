"""A report as sections of tables and figures, written three ways from one structure.

The numbers are formatted once, here, so `summary.md`, `report.html` and the
terminal always show the same digits. `report.html` inlines every PNG as a data
URI: one file that opens offline and can be mailed around. A section that
lacks the data it needs carries a `missing` line instead of a figure, so a
report on a partial run (an SGLang dump without shadow or logits) reads as
"here is what is missing and how to get it", not as an error.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable

from .. import names
from ..plotting import img_tag
from ..terminal import print_table


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str = ""
    #: shown in the terminal's short account of the report (the rest is in summary.md)
    headline: bool = False


@dataclass
class Figure:
    path: Path
    caption: str


@dataclass
class Section:
    key: str
    title: str
    intro: str = ""
    tables: list[Table] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    #: one-line findings for the terminal's short account
    headline: list[str] = field(default_factory=list)


def markdown(title: str, meta: list[str], sections: list[Section]) -> str:
    """summary.md. Every text is escaped (`names.markdown`): run names, workloads and rids
    reach the tables and captions, and a renderer must show them, not run them."""
    e = names.markdown
    out = [f"# {e(title)}", ""]
    out += [f"- {e(line)}" for line in meta]
    for s in sections:
        out += ["", f"## {e(s.title)}", ""]
        if s.intro:
            out += [e(s.intro), ""]
        out += [f"> missing: {e(m)}" for m in s.missing]
        if s.missing:
            out.append("")
        for t in s.tables:
            out += [f"### {e(t.title)}", ""]
            out.append("| " + " | ".join(e(c) for c in t.columns) + " |")
            out.append("| " + " | ".join("---" for _ in t.columns) + " |")
            out += ["| " + " | ".join(e(c) for c in row) + " |" for row in t.rows]
            if t.note:
                out += ["", e(t.note)]
            out.append("")
        out += [f"![{e(f.caption)}]({e(f.path.name)})" for f in s.figures]
    return "\n".join(out).rstrip() + "\n"


_CSS = (
    "body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;padding:0 1em;"
    "color:#222}table{border-collapse:collapse;margin:0.5em 0 1em}th,td{border:1px solid #ccc;"
    "padding:3px 8px;font-size:0.9em}td{text-align:right}td:first-child{text-align:left}"
    "th{background:#f0f0f0}figure{margin:1em 0}img{max-width:100%;border:1px solid #ddd}"
    "figcaption{font-size:0.85em;color:#555}.missing{color:#a00;background:#fff4f4;"
    "padding:0.4em 0.8em;border-left:3px solid #a00}nav a{margin-right:1em}.note{color:#555;"
    "font-size:0.85em}"
)


def html_page(title: str, meta: list[str], sections: list[Section]) -> str:
    e = html.escape
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{e(title)}</h1>",
        "<ul>" + "".join(f"<li>{e(m)}</li>" for m in meta) + "</ul>",
        "<nav>" + "".join(f'<a href="#{e(s.key)}">{e(s.title)}</a>' for s in sections) + "</nav>",
    ]
    for s in sections:
        parts.append(f'<section id="{e(s.key)}"><h2>{e(s.title)}</h2>')
        if s.intro:
            parts.append(f"<p>{e(s.intro)}</p>")
        parts += [f'<p class="missing">missing: {e(m)}</p>' for m in s.missing]
        for t in s.tables:
            head = "".join(f"<th>{e(c)}</th>" for c in t.columns)
            body = "".join(
                "<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in t.rows
            )
            parts.append(f"<h3>{e(t.title)}</h3><table><tr>{head}</tr>{body}</table>")
            if t.note:
                parts.append(f'<p class="note">{e(t.note)}</p>')
        for f in s.figures:
            parts.append(
                f"<figure>{img_tag(f.path, f.caption)}<figcaption>{e(f.caption)} "
                f"({e(f.path.name)})</figcaption></figure>"
            )
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def print_report_table(console: Console, t: Table) -> None:
    table = RichTable(title=t.title, title_justify="left")
    for i, c in enumerate(t.columns):
        table.add_column(c, justify="left" if i == 0 else "right")
    for row in t.rows:
        table.add_row(*row)
    print_table(console, table)  # cells as typed
    if t.note:
        console.print(f"[dim]{names.terminal(t.note)}[/dim]")


def print_sections(console: Console, sections: list[Section], *, every_table: bool) -> None:
    """The report in the terminal: each section's headline lines and headline tables (every
    table with `every_table`), and what it is missing."""
    for s in sections:
        for line in s.headline:
            console.print(names.printable(line), markup=False)
        for t in s.tables:
            if every_table or t.headline:
                print_report_table(console, t)
        for m in s.missing:
            console.print(f"[yellow]{names.terminal(f'{s.title}: missing: {m}')}[/yellow]")
