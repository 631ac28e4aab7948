"""The hook turned on by one SGLang launch flag, `--forward-hooks`.

SGLang 0.5.23's one plugin point for code inside its serving processes is
`--forward-hooks` (`model_executor/hook_manager.py`): every model runner of a
`launch_server` run (the target's and the draft's, on every TP rank of every DP rank)
imports the factory a spec names and calls it with the spec's `config`, after CUDA-graph
capture. `install` is such a factory. It returns None, so nothing is registered on the
model's forward path (a forward hook would cost a Python call per eager forward, and SGLang
logs one line per runner saying it registered none). What it does instead, once per
process: on the rank that reports for its DP rank (attention-TP rank 0), it finds the DSpark
worker's step observers, `DsparkStepObservers`, whether SGLang built them before this call
(0.5.23 builds the DSpark worker before capturing graphs) or builds them later, and attaches
the hook to them (`sglang_worker.attach_observers`), its ring joining the node's one
consumer on `listen`.

Where DSpark is off, or SGLang's observers are not 0.5.23's, it does nothing but log one
line. It never raises into SGLang. This module imports only the standard library until it
runs, then the hook's serving side (no pipeline, polars or estimator); it is the one place
dspark-obs imports sglang, from inside SGLang's own process.
"""

from __future__ import annotations

import gc
import logging
import sys

log = logging.getLogger(__name__)

#: what `--forward-hooks` names (`module:function`)
FACTORY = "dspark_obs.hooks.sglang_plugin:install"
#: the spec's name, and a module pattern that matches nothing (SGLang skips a spec without one)
SPEC_NAME = "dspark-obs"
NO_MODULE = "dspark-obs registers no forward hook"
DEFAULT_LISTEN = "127.0.0.1:9464"
#: the keys of a spec's `config`, with their defaults (None: SGLang's own value)
SETTINGS = {
    "listen": DEFAULT_LISTEN, "model_name": None, "ring_slots": 16, "pool_slots": None,
    "detail_metrics": False, "store": None, "retention_hours": None, "retention_gb": None,
    "sample_requests": None,
}  # fmt: skip
#: the settings that become the node consumer's options (`dspark-obs hook-consumer`)
CONSUMER_OPTIONS = {
    "store": "--store", "retention_hours": "--retention-hours",
    "retention_gb": "--retention-gb", "sample_requests": "--sample-requests",
}  # fmt: skip
#: where SGLang 0.5.23 defines the classes the hook looks for
OBSERVERS = "sglang.srt.speculative.dspark_components.dspark_observability"
POOLS = "sglang.srt.mem_cache.memory_pool"

_done = False
#: the hook this process attached (None: none), for the tools that look at a running one
attached = None


def spec(config: dict) -> list[dict]:
    """The `--forward-hooks` list that turns the hook on with `config`."""
    return [
        {
            "name": SPEC_NAME,
            "target_modules": [NO_MODULE],
            "hook_factory": FACTORY,
            "config": config,
        }
    ]


def settings(config: dict | None) -> dict:
    """`config` checked and completed; ValueError naming what is wrong."""
    from ..listen import parse_listen

    config = dict(config or {})
    unknown = sorted(set(config) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown config keys {unknown} (known: {sorted(SETTINGS)})")
    out = SETTINGS | config
    parse_listen(str(out["listen"]))
    for key in ("ring_slots", "pool_slots"):
        value = out[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):  # fmt: skip
            raise ValueError(f"{key} must be a positive integer, not {value!r}")
    if out["model_name"] is not None and not isinstance(out["model_name"], str):
        raise ValueError(f"model_name must be text, not {out['model_name']!r}")
    if not isinstance(out["detail_metrics"], bool):
        raise ValueError(f"detail_metrics must be true or false, not {out['detail_metrics']!r}")
    if out["store"] is not None and not isinstance(out["store"], str):
        raise ValueError(f"store must be a directory's path, not {out['store']!r}")
    for key in ("retention_hours", "retention_gb", "sample_requests"):
        value = out[key]
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                  or not value > 0):  # fmt: skip
            raise ValueError(f"{key} must be a positive number, not {value!r}")
    if out["sample_requests"] is not None and out["sample_requests"] > 1:
        raise ValueError(f"sample_requests must be at most 1, not {out['sample_requests']!r}")
    return out


def install(config: dict | None = None) -> None:
    """SGLang's hook factory: set the hook up once in this process; always None."""
    global _done
    if _done:
        return None
    _done = True
    try:
        _install(settings(config))
    except Exception as exc:  # never into SGLang's start-up
        log.warning("dspark-obs: the hook is off in this process: %s", exc)
    return None


def _install(options: dict) -> None:
    from .sglang_worker import knows_interface

    try:
        observers_module = __import__(OBSERVERS, fromlist=["DsparkStepObservers"])
        cls = observers_module.DsparkStepObservers
    except (ImportError, AttributeError) as exc:
        log.warning("dspark-obs: this SGLang has no DSpark step observers (%s); hook off", exc)
        return
    algorithm = _read("get_spec", "speculative_algorithm")
    if algorithm is not _UNKNOWN and str(algorithm).upper() != "DSPARK":
        log.warning("dspark-obs: DSpark is off (speculative algorithm %s); hook off", algorithm)
        return
    if not knows_interface(cls):
        log.warning(
            "dspark-obs: SGLang's DsparkStepObservers.observe_verify_step is not 0.5.23's; "
            "hook off (poll /server_info instead)"
        )
        return
    rank = _reporting_rank()
    if rank is None:
        log.debug("dspark-obs: this TP rank does not report its DP rank; no hook here")
        return
    built = _instances(cls)
    if built:
        _attach(built[0], rank, options)
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):  # the observers SGLang builds after this call
        original(self, *args, **kwargs)
        if cls.__init__ is __init__:
            cls.__init__ = original  # one hook a process
            try:
                _attach(self, rank, options)
            except Exception as exc:
                log.warning("dspark-obs: the hook is off in this process: %s", exc)

    cls.__init__ = __init__


def consumer_args(options: dict) -> tuple[str, ...]:
    """The node consumer's command-line options these settings ask for."""
    out = ["--detail-metrics"] if options["detail_metrics"] else []
    for key, flag in CONSUMER_OPTIONS.items():
        if options[key] is not None:
            out += [flag, str(options[key])]
    return tuple(out)


def _instances(*classes: type) -> list:
    """The live objects of exactly these classes. An instance refers to its class (what
    the collector follows), so this is one pass over the collector's objects, done once."""
    return [o for o in gc.get_referrers(*classes) if type(o) in classes]


def _pool_slots() -> int | None:
    """The request slots of this process's `ReqToTokenPool` (the device table of open tails
    is keyed by them), where SGLang has built one."""
    base = getattr(sys.modules.get(POOLS), "ReqToTokenPool", None)
    if base is None:
        return None
    sizes = []
    for pool in _instances(base, *base.__subclasses__()):
        table = getattr(pool, "req_to_token", None)
        if table is not None:
            sizes.append(int(table.shape[0]))
    return max(sizes, default=None)


def _attach(observers, rank: int, options: dict) -> None:
    from .sglang_worker import DEFAULT_POOL_SLOTS, attach_observers

    model = options["model_name"]
    if model is None:
        model = _read("get_serving", "served_model_name")
        model = "" if model is _UNKNOWN or model is None else str(model)
    global attached
    mode = str(getattr(observers._planner, "mode_value", "compact"))
    attached = attach_observers(
        observers,
        gamma=int(observers._gamma),
        pool_slots=options["pool_slots"] or _pool_slots() or DEFAULT_POOL_SLOTS,
        mode=mode,
        rank=rank,
        model_name=model,
        listen=options["listen"],
        ring_slots=options["ring_slots"],
        consumer_args=consumer_args(options),
    )
    log.info(
        "dspark-obs: hook on DP rank %d (%s, gamma %d); /metrics of this node on %s",
        rank, mode, int(observers._gamma), options["listen"],
    )  # fmt: skip


_UNKNOWN = object()


def _read(bag: str, name: str):
    """A value of SGLang's published configuration, or _UNKNOWN where none is published
    (a process SGLang's launcher did not start)."""
    try:
        from sglang.srt import runtime_context

        return getattr(getattr(runtime_context, bag)(), name)
    except Exception:
        return _UNKNOWN


def _reporting_rank() -> int | None:
    """This process's DP rank where it is the one that reports it (attention-TP and -CP
    rank 0), else None. Replicas and attention-DP groups number the ranks as SGLang's
    `num_dp_ranks` counts them; an unknown value reads as one rank, rank 0."""
    try:
        from sglang.srt.runtime_context import get_parallel

        parallel = get_parallel()
    except Exception:
        return 0

    def read(name: str, default: int) -> int:
        try:
            value = getattr(parallel, name)
        except Exception:
            return default
        return default if value is None else int(value)

    if read("attn_tp_rank", 0) != 0 or read("attn_cp_rank", 0) != 0:
        return None
    return read("dp_rank", 0) * read("attn_dp_size", 1) + read("attn_dp_rank", 0)
