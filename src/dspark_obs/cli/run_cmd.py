"""`dspark-obs run`: drive the reference runtime and write a run directory."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from ..aggregates import Aggregates
from ..calibration import StsCalibration, load_sts, save_sts
from ..estimator.online import CeilingEstimator
from ..pipeline import Pipeline
from ..runtime.config import RuntimeConfig
from ..runtime.cost_table import load_cost_table
from ..runtime.engine import DSparkRuntime
from ..runtime.language import parse_workload
from ..runtime.sts_warmup import warmup_sts
from ..store import RunWriter, open_run
from ..store.provenance import versions
from ..store.writer import FLUSH_SECONDS, FLUSH_STEPS
from .errors import CliError
from .progress import step_progress
from .summary_cmd import print_summary


def _number_list(cast: type, what: str):
    def parse(text: str) -> list:
        try:
            return [cast(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated {what}, got {text!r}"
            ) from None

    return parse


_int_list = _number_list(int, "integers")
_float_list = _number_list(float, "numbers")


def add_runtime_arguments(
    p: argparse.ArgumentParser, *, steps_per_level: int, concurrency: str, mode: str = "compact"
) -> None:
    g = p.add_argument_group("runtime")
    g.add_argument(
        "--seed", type=int, default=0, help="one seed fixes traffic and tokens (default 0)"
    )
    g.add_argument("--gamma", type=int, default=7, help="drafted tokens per block (default 7)")
    g.add_argument("--vocab-size", type=int, default=128, help="synthetic vocabulary (default 128)")
    g.add_argument(
        "--mode",
        choices=("static", "compact", "cap-accept"),
        default=mode,
        help=f"verify mode, as SGLANG_RAGGED_VERIFY_MODE (default {mode})",
    )
    g.add_argument(
        "--shadow",
        choices=("cap-accept",),
        default=None,
        help="run a cap-accept twin in lockstep and record its ceiling (compact only)",
    )
    g.add_argument(
        "--shadow-fraction",
        type=float,
        default=1.0,
        help="fraction of requests given a shadow twin (default 1.0)",
    )
    g.add_argument(
        "--workloads",
        default="gsm8k,arena,poetry",
        help="comma list of NAME, NAME=PRESET or NAME=PEAK; presets gsm8k, arena, "
        "poetry (easy to hard) (default gsm8k,arena,poetry)",
    )
    g.add_argument(
        "--mix",
        type=_float_list,
        default=None,
        help="relative arrival weight per workload (default equal)",
    )
    g.add_argument(
        "--concurrency",
        type=_int_list,
        default=_int_list(concurrency),
        help=f"concurrency levels swept in order (default {concurrency})",
    )
    g.add_argument(
        "--steps-per-level",
        type=int,
        default=steps_per_level,
        help=f"verify steps at each concurrency level (default {steps_per_level})",
    )
    g.add_argument(
        "--greedy-fraction",
        type=float,
        default=0.5,
        help="share of greedy requests; the rest sample (default 0.5)",
    )
    g.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help="sampling temperature of non-greedy requests (default 0.8)",
    )
    g.add_argument(
        "--max-new-tokens",
        type=int,
        default=1024,
        help="cap on generated tokens per request (default 1024)",
    )
    g.add_argument(
        "--cost-table",
        type=Path,
        default=None,
        help="additive SPS cost table, SGLang's JSON form (default: built-in H200-like)",
    )
    g.add_argument(
        "--step-noise",
        type=float,
        default=0.03,
        help="log-normal noise of simulated step times (default 0.03)",
    )
    g.add_argument(
        "--target",
        choices=("synthetic", "torch"),
        default="synthetic",
        help="target model: the hash-defined synthetic language, or a torch network whose "
        "verify forward is timed each step (measured timing; needs the torch extra)",
    )
    g.add_argument("--torch-hidden", type=int, default=512, help="torch target width (default 512)")
    g.add_argument(
        "--device", default=None, help="torch device (default cuda if present, else cpu)"
    )
    g.add_argument(
        "--sts",
        default="auto",
        help="confidence calibration: 'auto' (fit on a warm-up cap-accept run), "
        "'none' (raw confidence), or an STS JSON file (default auto)",
    )
    g.add_argument(
        "--sts-warmup-steps",
        type=int,
        default=150,
        help="steps of the STS warm-up run (default 150)",
    )


def install_stop_handlers(stop: threading.Event) -> None:
    """SIGTERM (systemd, docker stop) and SIGINT (Ctrl-C) set `stop` instead of killing, so
    the command ends between steps and closes its run store."""

    def handler(signum, frame):
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def add_store_arguments(p: argparse.ArgumentParser) -> None:
    """How often the run store publishes a part: the most a crash (SIGKILL, power loss) can
    cost is what was buffered since the last part, so these two bound the loss."""
    g = p.add_argument_group("run store")
    g.add_argument(
        "--flush-steps",
        type=int,
        default=FLUSH_STEPS,
        metavar="N",
        help=f"publish a part every N buffered steps (default {FLUSH_STEPS})",
    )
    g.add_argument(
        "--flush-seconds",
        type=float,
        default=FLUSH_SECONDS,
        metavar="S",
        help="publish a part once the oldest buffered step is S seconds old, checked as "
        f"steps arrive (default {FLUSH_SECONDS:g})",
    )


def store_options(args: argparse.Namespace) -> dict:
    """RunWriter keyword arguments from `add_store_arguments`, checked."""
    if args.flush_steps < 1 or not args.flush_seconds >= 0:
        raise CliError("--flush-steps must be >= 1 and --flush-seconds >= 0")
    return {"flush_steps": args.flush_steps, "flush_seconds": args.flush_seconds}


def refuse_existing_run(out: Path) -> None:
    """One line, exit 2: a run directory is written once, never appended to by a new command.

    After a crash (SIGKILL) the directory holds an incomplete run whose published parts
    stay readable; a restart must not mix a second run into it, so it is refused too.
    """
    manifest = Path(out) / "run.json"
    if not manifest.exists():
        return
    try:
        complete = json.loads(manifest.read_text(encoding="utf-8")).get("complete") is True
    except (OSError, ValueError, AttributeError):
        complete = True  # unreadable: say no more than that a run is there
    state = "" if complete else " (incomplete: its writer was stopped before closing it)"
    raise CliError(f"{out} already holds a run{state}; choose another --out")


def config_from_args(args: argparse.Namespace) -> RuntimeConfig:
    try:
        workloads = [parse_workload(s) for s in args.workloads.split(",") if s.strip()]
    except ValueError as exc:
        raise CliError(str(exc)) from None
    mix = args.mix if args.mix is not None else [1.0] * len(workloads)
    config = RuntimeConfig(
        seed=args.seed,
        gamma=args.gamma,
        vocab_size=args.vocab_size,
        mode=args.mode,
        shadow=args.shadow,
        shadow_fraction=args.shadow_fraction,
        workloads=workloads,
        mix=mix,
        concurrency=args.concurrency,
        steps_per_level=args.steps_per_level,
        greedy_fraction=args.greedy_fraction,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        step_noise=args.step_noise,
        target=args.target,
        torch_hidden=args.torch_hidden,
        device=args.device,
    )
    if args.cost_table is not None:
        config.cost_table = load_cost_table(args.cost_table)
    try:
        config.validate()
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return config


def resolve_sts(args: argparse.Namespace, config: RuntimeConfig) -> StsCalibration | None:
    if args.sts == "none":
        return None
    if args.sts == "auto":
        if args.sts_warmup_steps < 1:
            raise CliError("--sts-warmup-steps must be >= 1")
        return warmup_sts(config, args.sts_warmup_steps)
    cal = load_sts(args.sts)
    if len(cal.temperatures) != config.gamma:
        raise CliError(f"{args.sts}: {len(cal.temperatures)} temperatures for gamma={config.gamma}")
    return cal


def default_run_dir(mode: str) -> Path:
    return Path("runs") / f"{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{mode}"


def build_manifest(config: RuntimeConfig, sts: StsCalibration | None) -> dict:
    return {
        "format": 1,
        "source": "runtime",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "versions": versions(),
        "seed": config.seed,
        "gamma": config.gamma,
        "mode": config.mode,
        "shadow": config.shadow,
        "workloads": [w.name for w in config.workloads],
        "timing": config.timing,
        "target": config.target,
        "cost_table": config.manifest()["cost_table"],
        "sts": None
        if sts is None
        else {
            "temperatures": sts.temperatures,
            "ece_before": sts.ece_before,
            "ece_after": sts.ece_after,
            "num_samples": sts.num_samples,
        },
        "config": config.manifest(),
    }


def execute(
    config: RuntimeConfig,
    out: Path,
    sts: StsCalibration | None,
    *,
    show_progress: bool = True,
    on_pipeline: Callable[[Pipeline], object] | None = None,
    stop: threading.Event | None = None,
    store: dict | None = None,
) -> Path:
    """Run the runtime to completion (or until `stop` is set) through the pipeline into `out`.

    The pipeline's aggregates and ceiling estimator see every step in band
    (the estimator gathers from the runtime's verify distributions);
    `on_pipeline` gets it before the first step (the demo serves it). A run
    ended by `stop` (SIGTERM, Ctrl-C) is flushed and closed like a finished
    one, with `interrupted: true` in its manifest; `store` holds RunWriter
    options (flush interval).
    """
    if sts is not None:
        config.sts_temperatures = list(sts.temperatures)
    runtime = DSparkRuntime(config)
    start = time.perf_counter()
    writer = RunWriter(out, build_manifest(config, sts), **(store or {}))
    if sts is not None:
        save_sts(sts, out / "sts.json")
    pipeline = Pipeline(Aggregates(config.gamma), writer, estimator=CeilingEstimator(config.gamma))
    if on_pipeline is not None:
        on_pipeline(pipeline)
    interrupted = False
    try:
        with step_progress(runtime.total_steps, f"{config.mode} run", show_progress) as advance:
            for batch in runtime.run():
                pipeline.ingest(batch, "runtime", runtime.gather_target_logprobs)
                advance(batch)
                if stop is not None and stop.is_set():
                    interrupted = True
                    break
    finally:
        pipeline.close(
            {
                "wall_seconds": round(time.perf_counter() - start, 3),
                "requests_arrived": runtime.arrived,
                "requests_finished": runtime.finished,
            }
            | ({"interrupted": True} if interrupted else {})
        )
    return out


def handle(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    out = args.out or default_run_dir(config.mode)
    refuse_existing_run(out)
    store = store_options(args)
    # SIGTERM and Ctrl-C end the run between steps; what ran is flushed and closed.
    stop = threading.Event()
    install_stop_handlers(stop)
    sts = resolve_sts(args, config)
    if stop.is_set():
        print("interrupted before the first step; nothing stored", file=sys.stderr)
        return 0
    execute(config, out, sts, show_progress=not args.quiet, stop=stop, store=store)
    run = open_run(out)
    if run.manifest.get("interrupted"):
        steps = run.manifest.get("steps", 0)
        print(f"interrupted: {steps:,} steps stored in {out}", file=sys.stderr)
    if run.manifest.get("steps"):
        print_summary(run, as_json=args.json)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run the reference DSpark runtime and write a run directory",
        description="Run the embedded reference DSpark runtime (no GPU, no SGLang) "
        "over a concurrency sweep and write a run directory (Parquet + run.json).",
    )
    p.add_argument("--out", type=Path, default=None, help="run directory (default runs/TIME-MODE)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_runtime_arguments(p, steps_per_level=200, concurrency="1,8,32,64,128,256")
    add_store_arguments(p)
    p.set_defaults(handler=handle)
