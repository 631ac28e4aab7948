"""The one exception type the CLI turns into a clear message and a non-zero exit."""


class CliError(Exception):
    """A user-facing failure: bad arguments, unreadable input, a refused operation."""
