"""Arguments shared by the commands that drive the reference runtime or write a run store.

`run`, `demo`, `serve` and `runtime-server` take the same runtime options; one
definition keeps their names, defaults and checks from drifting apart.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..domain.cost_table import load_cost_table
from ..runtime.config import STS_WARMUP_STEPS, RuntimeConfig
from ..runtime.language import WorkloadProfile, parse_workload
from ..runtime.worlds import WORLDS
from ..store.writer import FLUSH_SECONDS, FLUSH_STEPS


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
    g.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="synthetic vocabulary (default 128; the real world's is its 256 bytes)",
    )
    g.add_argument(
        "--mode",
        choices=("static", "compact", "cap-accept"),
        default=mode,
        help=f"verify mode, as SGLANG_RAGGED_VERIFY_MODE (default {mode})",
    )
    g.add_argument(
        "--scheduler",
        choices=("sps", "topk"),
        default="sps",
        help="how compact mode picks windows: SGLang's SPS rule (default) or vLLM 0.33.0's "
        "top-k admission, its budget from last step's confidences",
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
        "--world",
        choices=tuple(WORLDS),
        default="reference",
        help="how serving departs from the reference runtime, to test the estimator where it "
        "was not designed: adversarial-confidence (head reads the draft's own probability; "
        "hidden per-request difficulty; token-dependent acceptance), unstable-slots (budget on "
        "2-step-old confidence; requests retracted and re-admitted in another slot; workloads "
        "with windows near 1 and near gamma), real (real text: trained byte-level target, block "
        "drafter and confidence head; workloads code, docs, changelog) (default reference)",
    )
    g.add_argument(
        "--workloads",
        default=None,
        help="comma list of NAME, NAME=PRESET or NAME=PEAK; presets gsm8k, arena, "
        "poetry (easy to hard); in the real world, some of code, docs, changelog (default: "
        "the world's own; gsm8k,arena,poetry in the reference world)",
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
        "--context-cost",
        type=float,
        default=None,
        metavar="SECONDS",
        help="simulated attention seconds per context token of each request's verify block, "
        "added to the cost table's step time (default: the world's; 0 but in the real world, "
        "2.7e-8; 0: step time ignores context)",
    )
    g.add_argument(
        "--target",
        choices=("synthetic", "torch"),
        default=None,
        help="target model of the synthetic worlds: the hash-defined synthetic language, or "
        "a torch network whose verify forward is timed each step (measured timing; needs "
        "the torch extra) (default synthetic; the real world runs its trained target)",
    )
    g.add_argument("--torch-hidden", type=int, default=512, help="torch target width (default 512)")
    g.add_argument(
        "--device",
        default=None,
        help="torch device (default cuda if present, else cpu; in the real world: cpu with "
        "simulated step times, while a named device, cpu included, times each verify forward)",
    )
    g.add_argument(
        "--real-weights",
        default=None,
        metavar="NPZ",
        help="the real world's networks (default: the weights shipped with the package)",
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
        default=STS_WARMUP_STEPS,
        help="steps of the STS warm-up run (default 150)",
    )


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


#: What a production store keeps unless told otherwise: on by default, so never unbounded.
DEFAULT_RETENTION_HOURS = 72.0
DEFAULT_RETENTION_GB = 10.0


def add_production_store_arguments(p: argparse.ArgumentParser, default: str | None) -> None:
    """`--store DIR` and its retention: the production record (`store/production.py`)."""
    g = p.add_argument_group("production store")
    g.add_argument(
        "--store",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep every step in a production store: one run directory per node, rank and "
        "hour, within the retention below" + (f" (default: {default})" if default else ""),
    )
    g.add_argument(
        "--retention-hours",
        type=float,
        default=DEFAULT_RETENTION_HOURS,
        metavar="H",
        help=f"delete hours older than H (default {DEFAULT_RETENTION_HOURS:g})",
    )
    g.add_argument(
        "--retention-gb",
        type=float,
        default=DEFAULT_RETENTION_GB,
        metavar="G",
        help="then delete the oldest hours while the store holds more than G GiB "
        f"(default {DEFAULT_RETENTION_GB:g})",
    )
    g.add_argument(
        "--sample-requests",
        type=float,
        default=1.0,
        metavar="F",
        help="keep this share of requests, each whole (every step of a kept request); "
        "steps keep their step-level figures (default 1: all)",
    )


def production_store_options(args: argparse.Namespace) -> dict:
    """ProductionStore keyword arguments from `add_production_store_arguments`, checked."""
    from ..store.production import Retention

    if not 0 < args.sample_requests <= 1:
        raise ValueError(f"--sample-requests must be in (0, 1], not {args.sample_requests}")
    if not (args.retention_hours > 0 and args.retention_gb > 0):
        raise ValueError("--retention-hours and --retention-gb must be > 0")
    return {
        "retention": Retention(args.retention_hours, int(args.retention_gb * (1 << 30))),
        "sample_requests": args.sample_requests,
    }


def store_options(args: argparse.Namespace) -> dict:
    """RunWriter keyword arguments from `add_store_arguments`, checked."""
    if args.flush_steps < 1 or not args.flush_seconds >= 0:
        raise ValueError("--flush-steps must be >= 1 and --flush-seconds >= 0")
    return {"flush_steps": args.flush_steps, "flush_seconds": args.flush_seconds}


def _world_workload(world: str, spec: str) -> WorkloadProfile:
    """A `--workloads` entry: the real world's are its own texts, named; any other world's
    are parsed as presets or peaks."""
    if WORLDS[world].target != "real":
        return parse_workload(spec)
    own = {w.name: w for w in WORLDS[world].workloads}
    if spec.strip() not in own:
        raise ValueError(f"workload {spec!r}: the real world's are {', '.join(own)}")
    return own[spec.strip()]


def config_from_args(args: argparse.Namespace) -> RuntimeConfig:
    """The runtime configuration `add_runtime_arguments` describes, validated."""
    workloads = None
    if args.workloads is not None:
        workloads = [_world_workload(args.world, s) for s in args.workloads.split(",") if s.strip()]
    config = RuntimeConfig(
        world=args.world,
        seed=args.seed,
        gamma=args.gamma,
        vocab_size=args.vocab_size,
        mode=args.mode,
        scheduler=args.scheduler,
        shadow=args.shadow,
        shadow_fraction=args.shadow_fraction,
        workloads=workloads,
        mix=args.mix,
        concurrency=args.concurrency,
        steps_per_level=args.steps_per_level,
        greedy_fraction=args.greedy_fraction,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        step_noise=args.step_noise,
        context_cost=args.context_cost,
        target=args.target,
        torch_hidden=args.torch_hidden,
        device=args.device,
        real_weights=args.real_weights,
    )
    if args.cost_table is not None:
        config.cost_table = load_cost_table(args.cost_table)
    config.validate()
    return config


def calibration_from_args(args: argparse.Namespace, config: RuntimeConfig, progress=None):
    """The STS calibration `--sts` names for this configuration (None: raw confidence);
    `progress` shows a warm-up run while it runs (`sts_warmup.Progress`)."""
    from ..runtime.sts_warmup import resolve_sts

    return resolve_sts(args.sts, config, args.sts_warmup_steps, progress)
