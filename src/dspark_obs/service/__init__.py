"""The live service: sources fed into one pipeline while `/metrics` is served (`serving`), and
the demo's reference run served while it is recorded (`demo`)."""

from .demo import check_can_listen, record_while_serving
from .serving import PollOptions, ServeFailed, ServeOptions, ServeResult, serve

__all__ = [
    "PollOptions",
    "ServeFailed",
    "ServeOptions",
    "ServeResult",
    "check_can_listen",
    "record_while_serving",
    "serve",
]
