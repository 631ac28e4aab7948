"""Worlds: runtimes built to break what the ceiling estimator assumes, with truth kept exact.

The reference world and the estimator were designed together: its confidence head is a
noisy monotone transform of the true acceptance probability, requests keep their slot
for life, and the scheduler reads the current step's confidence. An estimator that only
holds there has not been tested. Each other world changes how the serving side behaves
(what the head sees, when the scheduler sees it, where a request lives, how hard the
text is) and never how truth is made: the accept chain is still computed over the whole
block against the exact target, and the cap-accept shadow reads it to the end.
"""

from __future__ import annotations

from dataclasses import dataclass

from .language import PRESETS, WorkloadProfile

#: the real world's workloads, as `runtime/real/corpus.WORKLOADS` names them (kept here so
#: that naming a world imports no torch)
REAL_WORKLOADS = ("code", "docs", "changelog")


@dataclass(frozen=True)
class World:
    """How serving departs from the reference. Every default is the reference world's."""

    name: str
    #: what the head's raw logit is computed from: the true acceptance probability
    #: (reference), or the draft's own probability of the token it drafted
    confidence: str = "acceptance"
    #: a hidden per-request factor on draft fidelity, uniform in [1 - spread, 1]
    difficulty_spread: float = 0.0
    #: share of token ids the drafter over-proposes, and by how much (in units of the
    #: row's logit spread): acceptance then depends on which token was drafted
    hard_token_share: float = 0.0
    hard_token_lift: float = 0.0
    #: steps between the confidence the budget is planned on and the step it plans
    #: (SGLang's confidence relay; 0: the current step's own confidence)
    lag_steps: int = 0
    #: per decoding request-step chance of retraction, and the most steps it stays out
    retract_rate: float = 0.0
    max_gap_steps: int = 0
    #: simulated attention seconds per context token (`RuntimeConfig.context_cost`)
    context_cost: float = 0.0
    #: the workloads a run gets when it names none
    workloads: tuple[WorkloadProfile, ...] = tuple(PRESETS.values())
    #: whose language the requests speak: the hash-defined one (`synthetic`, or its `torch`
    #: twin) or the trained byte-level networks of `runtime/real/` (`real`)
    target: str = "synthetic"
    #: the vocabulary a world fixes (None: the run's `vocab_size`)
    vocab_size: int | None = None


REFERENCE = World("reference")

#: The head reads the draft's own probability (confident wherever the drafter is, which
#: is exactly where it is wrong on its over-proposed tokens), and a request's difficulty
#: is hidden from it.
ADVERSARIAL_CONFIDENCE = World(
    "adversarial-confidence",
    confidence="draft-probability",
    difficulty_spread=0.4,
    hard_token_share=0.25,
    hard_token_lift=1.0,
)

#: The budget is planned on two-step-old confidence, requests are retracted and come back
#: in another slot after a gap, and the workloads sit at the ends of the window range.
UNSTABLE_SLOTS = World(
    "unstable-slots",
    lag_steps=2,
    retract_rate=0.02,
    max_gap_steps=6,
    workloads=(
        WorkloadProfile("copy", peak=15.0, mean_output_len=200.0),
        PRESETS["arena"],
        WorkloadProfile("noise", peak=0.6, mean_output_len=120.0, draft_fidelity=0.7),
    ),
)

#: Real text: prompts cut from the held-out samples of the standard library's code, its
#: reference documentation and IDLE's changelog, continued by the trained target and drafted
#: by the trained block drafter, scored by the trained confidence head (runtime/real/). Its
#: profiles keep only what the traffic reads (name, prompt length): the networks make the rest.
REAL = World(
    "real",
    target="real",
    vocab_size=256,
    workloads=tuple(WorkloadProfile(w, peak=0.0, prompt_len=128) for w in REAL_WORKLOADS),
    # an 8B-class target's KV cache (32 layers x 8 heads x 128 x K and V in bf16: 128 KiB a
    # token) read at an H200's ~4.8 TB/s: its requests' contexts grow, so its simulated step
    # time does too, as a real one's does
    context_cost=2.7e-8,
)

WORLDS: dict[str, World] = {
    w.name: w for w in (REFERENCE, ADVERSARIAL_CONFIDENCE, UNSTABLE_SLOTS, REAL)
}
#: the worlds of the hash-defined language, whose truth a test can recompute from hashes
SYNTHETIC_WORLDS = tuple(name for name, w in WORLDS.items() if w.target == "synthetic")


def get_world(name: str) -> World:
    """The world called `name`, or ValueError naming the ones there are."""
    try:
        return WORLDS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown world {name!r}; worlds: {', '.join(WORLDS)}") from None
