"""Names that come from clients (request ids, workload and model names): one rule for all.

A name is whatever a client, a server or a file said. Before it is kept it is *cleaned*
(`clean`, `clean_list`): a character that cannot be printed (a newline, a terminal escape,
a lone surrogate that no encoder takes, another control or format character) becomes
U+FFFD, and a name longer than `MAX_LEN` characters becomes its first characters, `~` and
a hash of the whole, so that two long names stay two labels and a million-character rid
costs 128 characters in every label, table and file it reaches. Whoever cleans counts the
rows it changed. A cleaned name still holds what markup languages read, so each output
escapes it once more in its own way: `terminal` (rich markup, shown as typed),
`markdown` (HTML, and Markdown's links and table cells); figures never read `$` as
mathtext (`plotting.new_figure`).
Prometheus label values are escaped by the exposition writer; they are bounded here.

Only the standard library, so that the serving side of the SGLang hook can use it too.
"""

from __future__ import annotations

import hashlib
import html

#: Longest name kept, in characters (a label of at most 512 bytes of UTF-8).
MAX_LEN = 128
#: Hex digits of the hash that ends a shortened name.
HASH_LEN = 12
#: What an unprintable character of a name becomes.
REPLACEMENT = "\ufffd"


def is_clean(name: str) -> bool:
    """Whether `name` is kept as it is (printable, at most `MAX_LEN` characters)."""
    return len(name) <= MAX_LEN and name.isprintable()


def clean(name: object) -> str:
    """`name` as a kept name: a string, printable, at most `MAX_LEN` characters.

    A shortened name ends in `~` and the first `HASH_LEN` hex digits of the SHA-256 of
    the original (lone surrogates hashed as themselves), so distinct long names stay
    distinct and the same name always shortens the same way.
    """
    text = name if isinstance(name, str) else str(name)
    if is_clean(text):
        return text
    printable = "".join(c if c.isprintable() else REPLACEMENT for c in text)
    if len(printable) <= MAX_LEN:
        return printable
    return f"{printable[: MAX_LEN - HASH_LEN - 1]}~{_digest(text)}"


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:HASH_LEN]


def fit_bytes(text: str, max_bytes: int, original: str | None = None) -> str:
    """`text` in at most `max_bytes` bytes of UTF-8, for a part of a file name (a name is
    at most 255 bytes on most filesystems, so an unbounded label in one fails to write).

    As it is where it fits; else as many of its first characters as fit beside `~` and
    `HASH_LEN` hex digits of the SHA-256 of `original` (`text` itself by default: give the
    name `text` was made from, so that two names that make one text stay two).
    """
    if len(text.encode("utf-8", "surrogatepass")) <= max_bytes:
        return text
    room = max_bytes - HASH_LEN - 1
    head = text.encode("utf-8", "surrogatepass")[:room].decode("utf-8", "ignore")
    return f"{head}~{_digest(text if original is None else original)}"


def clean_list(names: list) -> tuple[list[str], int]:
    """Each of `names` cleaned, and how many of them changed (each distinct name cleaned once)."""
    kept = dict.fromkeys(names)
    changed = {n: clean(n) for n in kept if not (isinstance(n, str) and is_clean(n))}
    if not changed:
        return names, 0
    return [changed.get(n, n) for n in names], sum(n in changed for n in names)


def printable(text: str) -> str:
    """`text` for one terminal line: unprintable characters shown escaped (`\\n`, `\\x1b`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def terminal(text: str) -> str:
    """`text` inside rich markup: printable and shown as typed (`[/bold]` stays text)."""
    from rich.markup import escape

    return escape(printable(text))


def markdown(text: str) -> str:
    """`text` in Markdown (a table cell or a line): HTML escaped (`<script>` is text), `|`
    kept inside its cell, and no `](` that would make a link or an image of it."""
    escaped = html.escape(printable(text), quote=False)
    return escaped.replace("|", "\\|").replace("](", "]\\(")
