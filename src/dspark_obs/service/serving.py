"""`serve`: one or more sources into one pipeline, `/metrics` served until stopped.

The order of the steps is the operator's safety: everything that can be refused (a
source, the listen address, the web config, an existing run) is refused before the run
directory is created, so a corrected command is never blocked by the debris of a failed
one; a stop (Ctrl-C, SIGTERM) ends the sources between steps, then the store is flushed
and closed, so an interrupted service leaves a readable run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..calibration import StsCalibration
from ..exporters.endpoint import Exporter
from ..listen import parse_listen
from ..pipeline import SourceFailed, build_pipeline, run_sources
from ..recording import runtime_manifest
from ..runtime.config import RuntimeConfig
from ..sources import parse_source
from ..sources.replay import ReplaySource
from ..sources.runtime_source import RuntimeSource
from ..sources.sglang_http import DEFAULT_MAX_BYTES
from ..sources.sglang_poller import SGLangPoller
from ..sources.stats import IngestStats
from ..store import RunWriter, check_new_run_dir
from ..store.manifest import identity
from ..store.production import ProductionStore, check_store_dir
from ..telemetry.server_info import WorkloadOf


@dataclass
class PollOptions:
    """How SGLang servers are polled (`--source sglang:URL`)."""

    interval: float = 1.0
    timeout: float = 5.0
    retries: int = 3
    max_bytes: int = DEFAULT_MAX_BYTES
    clear: bool = True
    api_key: str | None = None
    gamma: int = 7
    workload_of: WorkloadOf | None = None


@dataclass
class ServeOptions:
    sources: list[str] = field(default_factory=lambda: ["runtime"])
    listen: str = "127.0.0.1:9464"
    web_config: Path | None = None
    workload_cap: int = 16
    #: the model_name label (None: the run's, the runtime world's, or `unknown`)
    model_name: str | None = None
    #: the families of fine detail too (outside the series budget)
    detail_metrics: bool = False
    window_steps: int = 1024
    speed: float = 1.0
    #: one run directory, unbounded (in place of a production store)
    out: Path | None = None
    #: a production store (`store/production.py`); the runtime source's default is
    #: DEFAULT_SERVE_STORE unless `no_store`
    store_dir: Path | None = None
    no_store: bool = False
    #: ProductionStore keyword arguments: retention, sample_requests
    production: dict = field(default_factory=dict)
    exit_when_done: bool = False
    store: dict = field(default_factory=dict)
    assume: str | None = None
    poll: PollOptions = field(default_factory=PollOptions)
    #: the reference runtime's configuration and calibration, made only for `runtime`
    runtime: Callable[[], tuple[RuntimeConfig, StsCalibration | None]] | None = None


#: Where `serve` on the runtime source keeps what it serves, within retention, by default.
DEFAULT_SERVE_STORE = Path("runs") / "serve-store"


class ServeFailed(RuntimeError):
    """A live source, or the run store, failed: `serve` stopped instead of serving on frozen
    metrics (the run, if any, is left incomplete or holds what was stored before)."""


@dataclass
class ServeResult:
    steps_ingested: int
    errors: dict[str, int]  # ingest errors by reason, over all sources
    dropped: dict[str, int]  # steps dropped before they were aggregated, by reason
    out: Path | None


def _check(options: ServeOptions) -> list[tuple[str, str | None]]:
    parsed = [parse_source(s) for s in options.sources]
    parse_listen(options.listen)
    if len(parsed) > 1 and {k for k, _ in parsed} != {"sglang"}:
        raise ValueError("several --source options are only for sglang:URL servers")
    if options.workload_cap < 1 or options.window_steps < 8:
        raise ValueError("--workload-cap must be >= 1 and --window-steps >= 8")
    poll = options.poll
    if options.speed < 0 or poll.interval <= 0 or poll.timeout <= 0:
        raise ValueError("--speed must be >= 0, --poll-interval and --poll-timeout > 0")
    if poll.max_bytes < 1:
        raise ValueError("--sglang-max-bytes must be >= 1")
    return parsed


def _open_sources(
    options: ServeOptions, parsed: list[tuple[str, str | None]], stats: IngestStats
) -> tuple[list, Path | None, dict]:
    """The sources, where their run is stored by default, and what its manifest says."""
    kind, arg = parsed[0]
    if kind == "runtime":
        config, sts = options.runtime()
        if sts is not None:
            config.sts_temperatures = list(sts.temperatures)
        manifest = runtime_manifest(config, sts) | {"source": "serve:runtime"}
        return [RuntimeSource(config, speed=options.speed)], options.out, manifest
    if kind == "run":
        source = ReplaySource(arg, speed=options.speed)
        engine, model = identity(source.run.manifest)
        manifest = dict(source.run.manifest) | {
            "source": f"serve:run:{arg}", "engine": engine, "model_name": model,
        }  # fmt: skip
        return [source], options.out, manifest
    poll = options.poll
    pollers = [
        SGLangPoller(
            url,
            stats=stats,
            index=i,
            interval=poll.interval,
            timeout=poll.timeout,
            retries=poll.retries,
            api_key=poll.api_key,
            clear=poll.clear,
            gamma=poll.gamma,
            workload_of=poll.workload_of,
            max_bytes=poll.max_bytes,
        )
        for i, url in enumerate(a for _, a in parsed)
    ]
    manifest = {
        "source": "serve:sglang", "engine": "sglang", "servers": [p.url for p in pollers],
        "gamma": poll.gamma,
    }  # fmt: skip
    return pollers, options.out, manifest


def _store_dir(options: ServeOptions, kind: str) -> Path | None:
    """The production store this service keeps, if any: `--store`, or the runtime source's
    bounded default where neither `--out` nor `--no-store` says otherwise."""
    if options.store_dir is not None:
        if options.out is not None or options.no_store:
            raise ValueError("--store, --out and --no-store are three answers to one question")
        return options.store_dir
    if options.no_store and options.out is not None:
        raise ValueError("--out and --no-store contradict each other")
    if kind == "runtime" and options.out is None and not options.no_store:
        return DEFAULT_SERVE_STORE
    return None


def _closing_manifest(sources: list) -> dict | None:
    """What only the end of serving knows, added to the run's manifest."""
    pollers = [s for s in sources if isinstance(s, SGLangPoller)]
    if pollers:
        return {
            "mode": next((p.mode for p in pollers if p.mode), None),
            "timing": "measured" if any(p.timed for p in pollers) else None,
            # steps the servers cleared that the run does not hold: lost to the read/clear
            # race (gaps), and taken but not converted before a stop's drain ran out
            "dropped_steps": sum(p.dropped_steps for p in pollers),
            "dropped_at_stop": sum(p.dropped_at_stop for p in pollers),
        }
    if isinstance(sources[0], RuntimeSource):
        runtime = sources[0].runtime  # as `run` records them
        return {"requests_arrived": runtime.arrived, "requests_finished": runtime.finished}
    return None


def _server_cost(sources: list) -> dict:
    """`build_pipeline`'s cost table and tiers where the one source knows them."""
    if len(sources) == 1 and isinstance(sources[0], RuntimeSource):
        config = sources[0].config
        return {"cost_table": config.cost_table, "capture_tiers": tuple(config.capture_tiers)}
    return {}


def serve(
    options: ServeOptions, stop: threading.Event, say: Callable[[str], object] = print
) -> ServeResult:
    """Serve until `stop` is set (or, with `exit_when_done`, until a finite source ends).

    `say` receives the lines an operator watches for: the URL once serving works, and
    when a source ends.
    """
    parsed = _check(options)
    host, port = parse_listen(options.listen)
    stats = IngestStats()
    sources, out, manifest = _open_sources(options, parsed, stats)
    store_dir = _store_dir(options, parsed[0][0])
    if options.model_name:
        manifest["model_name"] = options.model_name
    engine, model = identity(manifest)
    manifest |= {"engine": engine, "model_name": model}
    if out is not None:
        check_new_run_dir(out)
    if store_dir is not None:
        check_store_dir(store_dir)
    pipeline = build_pipeline(
        sources[0].gamma,
        stats=stats,
        workload_cap=options.workload_cap,
        window_steps=options.window_steps,
        assume_greedy={"greedy": True, "sampled": False, None: None}[options.assume],
        # the reference runtime's own cost table prices static's steps; other sources' the
        # online refit
        **_server_cost(sources),
    )
    exporter = Exporter(
        pipeline, host, port, options.web_config, identity=(engine, model),
        detail=options.detail_metrics,
    )  # fmt: skip
    try:
        url = exporter.start()
    except OSError as exc:
        raise OSError(f"cannot listen on {options.listen}: {exc.strerror or exc}") from None
    if out is not None or store_dir is not None:
        # created only once serving works: a refused port or web config must not leave an
        # incomplete run in --out that then blocks the corrected command
        manifest = {k: v for k, v in manifest.items() if k != "complete"}
        try:
            if out is not None:
                pipeline.writer = RunWriter(out, manifest, **options.store)
            else:
                pipeline.writer = ProductionStore(store_dir, manifest, **options.production)
        except BaseException:
            exporter.stop()
            raise
    names = ", ".join(s.name for s in sources)
    say(f"serving {url}  (source {names}; Ctrl-C to stop)")
    failure: SourceFailed | None = None
    try:
        fed = run_sources(sources, pipeline, stop)
        if not stop.is_set():
            say(f"source {names} ended after {fed:,} steps")
            if not options.exit_when_done:
                say("still serving the final values; Ctrl-C to stop")
                stop.wait()
    except SourceFailed as exc:
        failure = exc
    finally:
        stop.set()
        try:
            pipeline.close(_closing_manifest(sources))
        except OSError as exc:  # the store that failed rarely takes its last flush either
            if failure is None:
                raise
            failure.add_note(f"closing the run: {exc}")
        finally:
            exporter.stop()
    if failure is not None:
        notes = "; ".join(getattr(failure, "__notes__", []))
        raise ServeFailed(f"{failure}{'; ' + notes if notes else ''}; stopped serving") from None
    snap = pipeline.stats.snapshot()
    errors: dict[str, int] = {}
    for (_, reason), n in snap.errors.items():
        errors[reason] = errors.get(reason, 0) + n
    return ServeResult(sum(snap.records.values()), errors, dict(snap.dropped), out or store_dir)
