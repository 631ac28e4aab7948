"""The rich console for tables: the terminal's width, or 120 columns when piped."""

from rich.console import Console


def make_console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=120)
