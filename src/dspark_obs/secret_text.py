"""The one rule for keys and tokens read from files or the environment: checked where read,
never printed.

A key goes into an HTTP header (`Authorization: Bearer KEY`). A key with a newline or
another control character cannot: the HTTP client refuses the header with an error that
quotes the whole value, and that error reached logs and terminals. So every key is checked
as it is read, and a refusal names where it came from and which character is wrong, by
position and kind, never the key; `redact` takes a key out of any message that might
still carry one.
"""

from __future__ import annotations

import unicodedata

REDACTED = "<redacted>"


def _kind(ch: str) -> str:
    if ch in "\r\n":
        return "a line break"
    if ch in " \t":
        return "a space or tab"
    if unicodedata.category(ch).startswith("C"):
        return f"the control character U+{ord(ch):04X}"
    return "a character outside visible ASCII"


def check_secret(value: str, what: str) -> str:
    """`value`, or ValueError naming `what` and the first character a header cannot carry
    (visible ASCII only) by position and kind; the value itself is never in the message."""
    for i, ch in enumerate(value):
        if not "!" <= ch <= "~":
            raise ValueError(
                f"{what}: character {i + 1} of {len(value)} is {_kind(ch)}; a key is sent in "
                "an HTTP header and must be visible ASCII (the key is not shown)"
            )
    return value


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every secret, and every line of one, replaced by `REDACTED`."""
    for secret in secrets:
        if not secret:
            continue
        for part in sorted({secret, *secret.splitlines()}, key=len, reverse=True):
            if len(part) >= 4:  # a one-letter line would blank unrelated text
                text = text.replace(part, REDACTED)
    return text
