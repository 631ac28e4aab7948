"""The rich console for tables: the terminal's width, or 120 columns when piped.

Piped, tables keep 120 columns but lines of text are never broken: a path or a header
line must stay whole for whoever greps it."""

from rich.console import Console


def make_console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=120, soft_wrap=True)
