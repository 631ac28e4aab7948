"""Where the ranks of a node meet their one consumer: ring names and the consumer's lock.

Every serving process that observes a rank makes its own ring, named for the port the
node's `/metrics` is served on and its own process id; the consumer of that port finds
the rings by name, so ranks can come, go and come back in any order. The consumer holds
an exclusive `flock` on the port's lock file for as long as it runs: a hook learns that
no consumer is there by taking that lock for an instant (a non-blocking system call,
never a wait), and then starts one. A second consumer started in a race finds the lock
held and leaves.

Only the standard library: this module runs inside the serving process.
"""

from __future__ import annotations

import fcntl
import os
import subprocess  # nosec B404
import sys
import tempfile

from ..listen import parse_listen

#: where POSIX shared memory lives on Linux, the one system SGLang and vLLM serve on: the
#: rings' own namespace, listed by name (the lock file beside them is opened without
#: following a link)
SHM_DIR = "/dev/shm"  # nosec B108


def ring_prefix(port: int) -> str:
    return f"dspark-obs-{port}-"


def ring_name(port: int, pid: int | None = None) -> str:
    """The ring of one serving process (`pid`, default this one) for the consumer on `port`."""
    return f"{ring_prefix(port)}{os.getpid() if pid is None else pid}"


def ring_names(port: int) -> list[str]:
    """The rings made for the consumer on `port` that exist now."""
    prefix = ring_prefix(port)
    try:
        return sorted(n for n in os.listdir(SHM_DIR) if n.startswith(prefix))
    except OSError:
        return []


def lock_path(port: int) -> str:
    base = SHM_DIR if os.path.isdir(SHM_DIR) else tempfile.gettempdir()
    return os.path.join(base, f"dspark-obs-{port}.lock")


def take_lock(port: int) -> int | None:
    """The lock of `port`'s consumer, held through the returned descriptor (closing it
    releases it), or None when another process holds it."""
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(lock_path(port), flags, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def consumer_running(port: int) -> bool:
    """Whether a consumer holds `port`'s lock; it is taken and given back at once if not."""
    fd = take_lock(port)
    if fd is None:
        return True
    os.close(fd)
    return False


def start_consumer(listen: str, args: list[str] | None = None) -> subprocess.Popen:
    """`dspark-obs hook-consumer --listen LISTEN` in a session of its own, so that a signal
    to the serving process group does not stop the consumer that other ranks share; it
    leaves by itself once no ring is left (`--idle-exit`)."""
    cmd = [sys.executable, "-m", "dspark_obs", "hook-consumer", "--listen", listen, *(args or [])]
    return subprocess.Popen(  # nosec B603
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,  # its log goes to stderr, beside the serving process's
        start_new_session=True,
        close_fds=True,
    )


def join_consumer(hook, ring, consumer: str, port: int | None, listen: str | None, pipeline,
                  gamma: int) -> None:  # fmt: skip
    """Give a new hook's `ring` to its consumer: an inline one built here (`consumer="inline"`:
    tests, notebooks; on `pipeline` or a new one), or the node's consumer process on `port`,
    started for `listen` if none holds the port. Every engine's hook joins one this way."""
    if consumer == "inline":
        from ..pipeline import build_pipeline
        from .node_consumer import NodeConsumer

        hook.consumer = NodeConsumer(pipeline or build_pipeline(gamma))
        hook.consumer.add(ring)
    elif not consumer_running(port):
        hook.process = start_consumer(listen, hook.consumer_args)


def consumer_port(consumer: str, listen: str | None) -> int | None:
    """The node consumer's port a hook's ring joins (`consumer="process"`), or None for an
    inline consumer; ValueError for another kind, or a process consumer with no `listen`."""
    if consumer not in ("process", "inline"):
        raise ValueError(f"consumer must be 'process' or 'inline', not {consumer!r}")
    if consumer == "inline":
        return None
    if listen is None:
        raise ValueError("a consumer process needs listen=HOST:PORT to serve /metrics on")
    return parse_listen(listen)[1]
