"""Everything that defines a reference-runtime run; recorded whole in the run manifest."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from ..domain.cost_table import DEFAULT_CAPTURE_TIERS, AdditiveCostTable, default_cost_table
from ..telemetry.batch import MODES
from .drafter import DrafterConfig
from .language import WorkloadProfile
from .worlds import REAL_WORKLOADS, REFERENCE, WORLDS, World, get_world

#: steps of the warm-up run that `--sts auto` fits STS on, unless told otherwise
STS_WARMUP_STEPS = 150


@dataclass
class RuntimeConfig:
    seed: int = 0
    gamma: int = 7
    #: None: the world's own (the real world's 256 bytes), else 128
    vocab_size: int | None = None
    mode: str = "compact"
    #: how a compact step's windows are chosen: SGLang's SPS rule, or vLLM 0.33.0's top-k
    #: admission with its budget from last step's confidences (`scheduler.topk_schedule`)
    scheduler: str = "sps"
    shadow: str | None = None
    shadow_fraction: float = 1.0
    world: str = "reference"
    #: None: the world's own workloads, equally mixed
    workloads: list[WorkloadProfile] | None = None
    mix: list[float] | None = None
    concurrency: list[int] = field(default_factory=lambda: [1, 8, 32, 64, 128, 256])
    steps_per_level: int = 200
    #: verify steps at each level, one per `concurrency` entry, in place of `steps_per_level`
    #: (a sweep that holds as many request-steps at batch 1 as at 128)
    level_steps: list[int] | None = None
    greedy_fraction: float = 0.5
    temperature: float = 0.8
    max_new_tokens: int = 1024
    step_noise: float = 0.03
    #: seconds of simulated attention per context token a verify block reads (`engine.
    #: attention_seconds`); 0 keeps the cost table's step times, which ignore context;
    #: None: the world's own (0 but in the real world)
    context_cost: float | None = None
    cost_table: AdditiveCostTable = field(default_factory=default_cost_table)
    sts_temperatures: list[float] | None = None
    #: the compact scheduler's budget times this (1: SGLang's rule; `whatif`'s ground truth)
    budget_scale: float = 1.0
    capture_tiers: tuple[int, ...] = DEFAULT_CAPTURE_TIERS
    drafter: DrafterConfig = field(default_factory=DrafterConfig)
    #: None: the world's own (`real` in the real world), else `synthetic`
    target: str | None = None
    torch_hidden: int = 512
    device: str | None = None
    #: True: the real world's step times come from the cost table even on a named device
    #: (a study of acceptance runs its networks on a GPU for speed, not for their timings)
    simulated_times: bool = False
    #: the real world's networks (None: the weights committed with the package)
    real_weights: str | None = None

    def __post_init__(self) -> None:
        if self.workloads is None:
            known = isinstance(self.world, str) and self.world in WORLDS
            self.workloads = list((WORLDS[self.world] if known else REFERENCE).workloads)
        if self.mix is None:
            self.mix = [1.0] * len(self.workloads)
        world = WORLDS.get(self.world, REFERENCE) if isinstance(self.world, str) else REFERENCE
        if self.vocab_size is None:
            self.vocab_size = world.vocab_size or 128
        if self.target is None:
            self.target = world.target
        if self.context_cost is None:
            self.context_cost = world.context_cost

    @property
    def world_spec(self) -> World:
        """What the run's world changes (ValueError for a name that is no world)."""
        return get_world(self.world)

    @property
    def timing(self) -> str:
        """How step times are obtained, as recorded in the run manifest: measured on a torch
        target, and in the real world when a device is named (unless `simulated_times`);
        simulated otherwise."""
        on_device = self.target == "real" and self.device is not None
        if self.target == "torch" or (on_device and not self.simulated_times):
            return "measured"
        return "simulated"

    def steps_at(self) -> list[int]:
        """Verify steps at each concurrency level."""
        return list(self.level_steps or [self.steps_per_level] * len(self.concurrency))

    @property
    def total_steps(self) -> int:
        """Verify steps in one pass of the concurrency sweep."""
        return sum(self.steps_at())

    def validate(self) -> None:
        world = get_world(self.world)
        if self.target not in ("synthetic", "torch", "real"):
            raise ValueError(f"target must be synthetic or torch, got {self.target!r}")
        if (self.target == "real") != (world.target == "real"):
            raise ValueError(
                "the real world runs its own trained target (and only it does): "
                f"world {self.world!r} with target {self.target!r}"
            )
        if world.vocab_size is not None and self.vocab_size != world.vocab_size:
            raise ValueError(
                f"the {self.world} world's vocabulary is its {world.vocab_size} tokens, "
                f"not {self.vocab_size}"
            )
        if self.real_weights is not None and world.target != "real":
            raise ValueError(f"real weights name the real world's networks, not the {self.world}'s")
        if world.target == "real":
            unknown = sorted({w.name for w in self.workloads} - set(REAL_WORKLOADS))
            if unknown:
                raise ValueError(
                    f"the real world's workloads are {', '.join(REAL_WORKLOADS)}; "
                    f"not {', '.join(unknown)}"
                )
        if self.torch_hidden < 8:
            raise ValueError("torch hidden size must be >= 8")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.shadow not in (None, "cap-accept"):
            raise ValueError("the only shadow is cap-accept")
        if self.shadow and self.mode != "compact":
            raise ValueError("a cap-accept shadow only makes sense beside a compact run")
        if not 0.0 < self.shadow_fraction <= 1.0:
            raise ValueError("shadow fraction must be within (0, 1]")
        if not 1 <= self.gamma <= 64:
            raise ValueError("gamma must be within 1..64")
        if self.vocab_size < 4:
            raise ValueError("vocabulary must have at least 4 tokens")
        if not self.workloads:
            raise ValueError("at least one workload is needed")
        names = [w.name for w in self.workloads]
        if len(set(names)) != len(names):
            raise ValueError(f"workload names repeat: {names}")
        for w in self.workloads:
            if not 0.0 < w.draft_fidelity <= 1.0:
                raise ValueError(f"workload {w.name}: draft fidelity must be within (0, 1]")
        if len(self.mix) != len(self.workloads):
            raise ValueError(f"{len(self.mix)} mix weights for {len(self.workloads)} workloads")
        if not self.concurrency or min(self.concurrency) < 1 or max(self.concurrency) > 4096:
            raise ValueError("concurrency levels must be within 1..4096")
        if self.steps_per_level < 1:
            raise ValueError("steps per level must be >= 1")
        if self.level_steps is not None and (
            len(self.level_steps) != len(self.concurrency) or min(self.level_steps) < 1
        ):
            raise ValueError("level steps: one count >= 1 per concurrency level")
        if self.max_new_tokens < 1:
            raise ValueError("max new tokens must be >= 1")
        if self.scheduler not in ("sps", "topk"):
            raise ValueError(f"scheduler must be sps or topk, not {self.scheduler!r}")
        if self.scheduler == "topk" and self.budget_scale != 1.0:
            raise ValueError("a scaled budget is an SPS rule; the topk scheduler takes none")
        if not (np.isfinite(self.budget_scale) and self.budget_scale >= 0):
            raise ValueError("budget scale must be finite and >= 0")
        if self.step_noise < 0:
            raise ValueError("step noise must be >= 0")
        if not (np.isfinite(self.context_cost) and self.context_cost >= 0):
            raise ValueError("context cost must be finite and >= 0")
        if self.sts_temperatures is not None and (
            len(self.sts_temperatures) != self.gamma or min(self.sts_temperatures) <= 0
        ):
            raise ValueError(f"STS needs {self.gamma} positive temperatures (one per position)")

    def manifest(self) -> dict:
        """JSON-ready description of the run's configuration."""
        d = asdict(self)
        d["cost_table"] = {
            k: getattr(self.cost_table, k) for k in self.cost_table.__struct_fields__
        }
        d["capture_tiers"] = list(self.capture_tiers)
        return d
