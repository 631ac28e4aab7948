"""How a `dspark-obs serve` child is started and known to be up, for the bench and the tests.

Both start real `serve` processes on a port the OS picks, and both learn the
port only from the line serve prints once it listens. Keeping that argv and
that line's pattern in one place means a change to serve's flags or its
announcement is made once, not in every harness that drives it.
"""

from __future__ import annotations

import re

#: The line `serve` prints once it listens; `url` is its metrics endpoint.
SERVING = re.compile(r"^serving (?P<url>https?://\S+/metrics)", re.MULTILINE)
#: Loopback, port 0: the OS picks a free port, so parallel children never collide.
EPHEMERAL = "127.0.0.1:0"


def serve_args(*sources: str, speed: float | None = None, listen: str = EPHEMERAL) -> list[str]:
    """`serve` over `sources` (`speed=0`: a replay or the runtime as fast as it can go)."""
    args = ["serve"]
    for source in sources:
        args += ["--source", source]
    if speed is not None:
        args += ["--speed", str(speed)]
    return [*args, "--listen", listen]
