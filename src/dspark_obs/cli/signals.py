"""Ctrl-C and SIGTERM as a request to stop between steps, not a kill.

systemd, docker stop and a terminal all stop a long-running command this way; the
command then closes its run store, so what ran is flushed and readable.
"""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT set from now on."""
    stop = threading.Event()

    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop
