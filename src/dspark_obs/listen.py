"""`HOST:PORT` as every command that listens takes it, and the hook that runs inside a
serving process (so the standard library only)."""

from __future__ import annotations


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT`."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT")
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen {text!r}: port outside 0..65535")
    return host.strip("[]"), int(port)
