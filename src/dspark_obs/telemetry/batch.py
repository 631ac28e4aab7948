"""`StepBatch`: one verify step of one rank, as columns over the batch.

A step travels through dspark-obs as numpy arrays shaped `[bs]` and
`[bs, gamma]`, never as a Python object per request: every consumer (run store,
aggregates, estimator) works on whole columns, so the cost of a step does not
grow with a per-request interpreter loop.

Field names follow SGLang's `DecodeStepRecord` / `ReqDetail` where SGLang has
the field. Step fields SGLang leaves unset hold its own sentinels (`-1` for
integers, `None` for optional values) so that a record converts back exactly.
Per-request values that a source cannot know hold `-1` (integers) or NaN
(floats); `greedy` is 1, 0, or -1 where the source does not say (SGLang's
dumps carry no sampling parameters). Whole per-request matrices a source lacks
are `None`.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import get_type_hints

import numpy as np

MODES = ("static", "compact", "cap-accept")

#: Verify modes as arrays and the compiled folds number them ("" is an unlabelled step,
#: which follows compact's rules).
MODE_CODE = {"static": 0, "compact": 1, "cap-accept": 2, "": 1}
MODE_STATIC, MODE_COMPACT, MODE_CAP_ACCEPT = 0, 1, 2

#: Largest block size accepted from outside. Histograms and matrices are sized by gamma,
#: so an absurd gamma in a corrupt record must be refused before anything is allocated
#: for it; 64 is also the reference runtime's limit and far above SGLang's usual 4..16.
MAX_GAMMA = 64

#: numpy's int64 range: integer fields from JSON are unbounded Python ints until here.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: Largest `req_pool_index` accepted. It is a slot in the server's request pool (bounded by
#: its running-request cap, a few thousand at most); the estimator keeps per-slot state in
#: arrays indexed by it, so an absurd index would make it allocate without bound.
MAX_REQ_POOL_INDEX = (1 << 20) - 1
#: A step counter counts up from 0; the estimator keeps step numbers in float64 matrices,
#: exact up to 2**53 (about 285 years at a million steps per second).
MAX_FORWARD_CT = 2**53
#: Largest jump of a rank's step counter counted as steps lost (about a year of a rank at
#: 100 steps per second): a larger one is a counter that cannot be trusted (a corrupt
#: record, a server whose counter was reset to something else), counted as such and
#: followed from its new value, never added to a count of missing steps.
MAX_STEP_GAP = 2**32

#: Longest time a step's `_ms` fields may hold: an hour. A verify step takes milliseconds;
#: a larger value is no time (replay would sleep it out, and 1e15 ms overflows the clock).
MAX_STEP_MS = 3_600_000.0

#: Our vocabulary over SGLang's per-request fields, derived here and nowhere else.
#:
#: `StepBatch`, the run store's tables and the wire types keep SGLang's names
#: (`verify_len`, `correct_drafts`, `acc_len`, `cap_trim`): they mirror SGLang's record
#: exactly, and the on-disk schema does not change. Everything that reasons about a step
#: (aggregates, estimator, tail walk) reads our names through `StepBatch`'s properties of
#: the same names (`RequestRows` joins them over a fold's steps), never re-deriving them:
#:
#: | ours        | from SGLang's                | meaning                                  |
#: |-------------|------------------------------|------------------------------------------|
#: | `window`    | `verify_len - 1`             | drafts verified, 0..gamma (verify_len    |
#: |             |                              | counts the anchor token)                 |
#: | `accepted`  | `correct_drafts`             | drafts accepted, 0..window               |
#: | `committed` | `acc_len`                    | tokens committed, accepted + the bonus,  |
#: |             |                              | 0..gamma + 1                             |
#: | `ceiling`   | `correct_drafts`, `cap_trim` | drafts full verification accepts, -1     |
#: |             | and the verify mode          | where the mode censors it (ceiling_rule) |
#:
#: The compiled row fold (`aggregates/_rowfold.c`) reads SGLang's columns in place and
#: applies the same table; tests/test_rowfold.py holds it to the numpy fold, which reads
#: these properties.
VOCABULARY: dict[str, tuple[str, ...]] = {
    "window": ("verify_len",),
    "accepted": ("correct_drafts",),
    "committed": ("acc_len",),
    "ceiling": ("correct_drafts", "cap_trim"),
}

#: Per-request columns shaped `[bs]`, with their numpy dtype.
REQUEST_COLUMNS: dict[str, type] = {
    "rid": object,
    "workload": object,
    "req_pool_index": np.int64,
    "prefix_len": np.int64,
    "verify_len": np.int64,
    "correct_drafts": np.int64,
    "acc_len": np.int64,
    "cap_trim": np.int64,
    "bonus_token": np.int64,
    "greedy": np.int8,
    "temperature": np.float64,
    "shadow_ceiling": np.int64,
    "bonus_logprob": np.float64,
}

#: Per-request columns shaped `[bs, gamma]`; optional (a source may lack them).
MATRIX_COLUMNS: dict[str, type] = {
    "draft_tokens": np.int64,
    "confidence": np.float64,
    "survival": np.float64,
    "confidence_logits": np.float64,
    "draft_logprobs": np.float64,
    "target_logprobs": np.float64,
}

#: Step scalars that are `int` with SGLang's `-1` meaning "not recorded".
STEP_INT_FIELDS = (
    "bs",
    "num_running_reqs",
    "num_verify_tokens",
    "verify_tokens_local",
    "verify_tokens_dp_synced",
    "verify_tokens_graph_key",
)
#: Step scalars that are optional (`None` meaning "not recorded").
STEP_OPTIONAL_INT_FIELDS = ("budget", "lag_steps")
STEP_OPTIONAL_FLOAT_FIELDS = (
    "predicted_step_ms",
    "predicted_theta",
    "step_cpu_ms",
    "step_gpu_ms",
    "draft_gpu_ms",
    "target_verify_gpu_ms",
)


class InvalidBatch(ValueError):
    """A step that breaks the telemetry model; `reason` is a short label for counting."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(eq=False)
class StepBatch:
    """One verify step of one rank.

    `has_reqs` is False when the source recorded only step-level components
    (SGLang without the `reqs` dump component); the per-request arrays are then
    empty while `bs` still says how many requests ran.
    """

    forward_ct: int
    gamma: int
    mode: str = ""
    rank: int = 0
    bs: int = -1
    budget: int | None = None
    lag_steps: int | None = None
    num_running_reqs: int = -1
    num_verify_tokens: int = -1
    verify_tokens_local: int = -1
    verify_tokens_dp_synced: int = -1
    verify_tokens_graph_key: int = -1
    predicted_step_ms: float | None = None
    predicted_theta: float | None = None
    step_cpu_ms: float | None = None
    step_gpu_ms: float | None = None
    draft_gpu_ms: float | None = None
    target_verify_gpu_ms: float | None = None
    has_reqs: bool = True
    # per request, [bs]
    rid: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    workload: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=object))
    req_pool_index: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    prefix_len: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    verify_len: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    correct_drafts: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    acc_len: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    cap_trim: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    bonus_token: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    greedy: np.ndarray = field(default_factory=lambda: np.empty(0, np.int8))
    temperature: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    shadow_ceiling: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    bonus_logprob: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    # optional categorical form of `workload` (workload == workload_names[workload_codes]),
    # filled by sources that know their categories so that consumers can group
    # rows without a dictionary lookup per request
    workload_codes: np.ndarray | None = None
    workload_names: tuple[str, ...] | None = None
    # per request, [bs, gamma]; None when the source lacks them
    draft_tokens: np.ndarray | None = None
    confidence: np.ndarray | None = None
    survival: np.ndarray | None = None
    confidence_logits: np.ndarray | None = None
    draft_logprobs: np.ndarray | None = None
    target_logprobs: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.mode and self.mode not in MODES:
            raise ValueError(f"unknown verify mode {self.mode!r}; expected one of {MODES}")

    @classmethod
    def from_columns(cls, values: dict) -> StepBatch:
        """A batch from a dict of its fields, without `__init__`.

        For decoders building the many steps of one payload: matching some forty keyword
        arguments costs more than all the rest of assembling a step. `values` holds
        forward_ct, gamma, every per-request column (REQUEST_COLUMNS) and whatever else
        differs from its default. Nothing is checked, `__post_init__`'s mode included:
        the caller has.
        """
        batch = cls.__new__(cls)
        batch.__dict__.update(_PLAIN_DEFAULTS)
        batch.__dict__.update(values)
        return batch

    @property
    def num_reqs(self) -> int:
        """Rows actually present (0 when the source had no `reqs`)."""
        return len(self.prefix_len)

    def take_rows(self, index: np.ndarray) -> StepBatch:
        """The same step with only the request rows `index` (a sample of its requests): the
        step's own fields, `bs` among them, say what ran, the rows what is kept."""
        values = {k: v for k, v in self.__dict__.items()}
        for name in REQUEST_COLUMNS:
            values[name] = getattr(self, name)[index]
        for name in MATRIX_COLUMNS:
            mat = getattr(self, name)
            values[name] = None if mat is None else mat[index]
        if self.workload_codes is not None:
            values["workload_codes"] = self.workload_codes[index]
        return StepBatch.from_columns(values)

    # -- our vocabulary (VOCABULARY): the one derivation from SGLang's fields --------

    @property
    def window(self) -> np.ndarray:
        """Drafts verified per request: SGLang's `verify_len` counts the anchor."""
        return self.verify_len - 1

    @property
    def accepted(self) -> np.ndarray:
        """Drafts accepted per request (SGLang's `correct_drafts`, the same array)."""
        return self.correct_drafts

    @property
    def committed(self) -> np.ndarray:
        """Tokens committed per request, the bonus included (SGLang's `acc_len`)."""
        return self.acc_len

    @property
    def ceiling(self) -> np.ndarray:
        """Drafts full-block verification accepts, where the mode reveals it (-1: censored);
        the rule is `ceiling_rule`."""
        return ceiling_rule(MODE_CODE[self.mode], self.correct_drafts, self.cap_trim)

    def validate(self) -> None:
        """Raise InvalidBatch when columns disagree in shape or break DSpark's invariants."""
        self.validate_step()
        n = self.num_reqs
        for name in REQUEST_COLUMNS:
            col = getattr(self, name)
            if col.shape != (n,):
                raise InvalidBatch(
                    "malformed", f"column {name} has shape {col.shape}, expected ({n},)"
                )
        for name in MATRIX_COLUMNS:
            mat = getattr(self, name)
            if mat is not None and mat.shape != (n, self.gamma):
                raise InvalidBatch(
                    "malformed",
                    f"column {name} has shape {mat.shape}, expected ({n}, {self.gamma})",
                )
        if self.has_reqs and self.bs not in (-1, n):
            raise InvalidBatch("malformed", f"bs={self.bs} but {n} request rows")
        self.validate_rows()

    def validate_step(self) -> None:
        """The step scalars' part of `validate`.

        Apart so that a decoder holding the rows of many steps in one set of columns
        checks the scalars step by step and the rows once for all steps.
        """
        if not _is_int(self.gamma) or not 1 <= self.gamma <= MAX_GAMMA:
            raise InvalidBatch("gamma_out_of_range", f"gamma {self.gamma!r} outside 1..{MAX_GAMMA}")
        # Step scalars come straight from JSON: a value numpy cannot hold would crash the
        # aggregates (OverflowError) far from where it entered, so it is refused here.
        for name in ("forward_ct", "rank", *STEP_INT_FIELDS, *STEP_OPTIONAL_INT_FIELDS):
            value = getattr(self, name)
            if value is None and name in STEP_OPTIONAL_INT_FIELDS:
                continue
            if not _is_int(value) or not INT64_MIN <= value <= INT64_MAX:
                raise InvalidBatch("malformed", f"{name}={value!r} is not a 64-bit integer")
        if not 0 <= self.forward_ct <= MAX_FORWARD_CT:
            raise InvalidBatch("malformed", f"forward_ct {self.forward_ct} outside 0..2**53")
        self.validate_times()

    def validate_times(self) -> None:
        """The optional times and predictions of `validate_step`: finite and not negative,
        SGLang's -1 (a field its components do not cover) taken as no value. Apart for a
        decoder whose parser has checked every other step scalar already."""
        for name in STEP_OPTIONAL_FLOAT_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            if value == -1 and not isinstance(value, bool):
                # SGLang writes -1 where a component does not cover a field: no value,
                # not a negative time
                setattr(self, name, None)
                continue
            if isinstance(value, bool) or not isinstance(
                value, (float, int, np.floating, np.integer)
            ):
                raise InvalidBatch("malformed", f"{name}={value!r} is not a number")
            # a time of -1e308 or NaN would turn every mean it enters into -inf or NaN
            if not math.isfinite(value) or (name.endswith("_ms") and not 0 <= value <= MAX_STEP_MS):
                raise InvalidBatch(
                    "time_out_of_range",
                    f"{name}={value!r} is not a finite time in 0..{MAX_STEP_MS:.0f} ms",
                )

    def validate_rows(self) -> None:
        """The per-request part of `validate`: every check is row by row, so it holds for
        columns stacking the rows of several steps exactly when it holds for each step."""
        if self.num_reqs:
            pool = self.req_pool_index
            if (pool < -1).any() or (pool > MAX_REQ_POOL_INDEX).any():
                raise InvalidBatch(
                    "pool_index_out_of_range", f"req_pool_index outside -1..{MAX_REQ_POOL_INDEX}"
                )
            w = self.window
            if (w < 0).any() or (w > self.gamma).any():
                raise InvalidBatch("window_out_of_range", f"window outside 0..gamma={self.gamma}")
            if (self.correct_drafts < 0).any() or (self.correct_drafts > w).any():
                raise InvalidBatch("accepted_out_of_range", "correct_drafts outside 0..window")
            # gamma - correct_drafts, not correct_drafts + cap_trim: the sum of a huge
            # cap_trim would wrap around int64 and slip through
            if (self.cap_trim < 0).any() or (
                self.cap_trim > self.gamma - self.correct_drafts
            ).any():
                raise InvalidBatch(
                    "cap_trim_out_of_range", "cap_trim outside 0..gamma-correct_drafts"
                )
            if (self.acc_len < 0).any() or (self.acc_len > self.gamma + 1).any():
                raise InvalidBatch("committed_out_of_range", "acc_len outside 0..gamma+1")
            shadow = self.shadow_ceiling
            if (shadow < -1).any() or (shadow > self.gamma).any():
                raise InvalidBatch("ceiling_out_of_range", "shadow_ceiling outside -1..gamma")
            for name in ("confidence", "survival"):
                mat = getattr(self, name)
                # two reductions, no temporaries; a NaN makes min or max NaN, failing both
                if mat is not None and mat.size and not (mat.min() >= 0 and mat.max() <= 1):
                    raise InvalidBatch("probability_out_of_range", f"{name} outside [0, 1] or NaN")


def ceiling_rule(mode, accepted: np.ndarray, cap_trim: np.ndarray) -> np.ndarray:
    """The ceiling each row's verify mode reveals, in accepted drafts; -1 where it censors.

    static verifies the whole block, so its accepted count is the ceiling; cap-accept
    reports what it accepted past the window in `cap_trim`, so the ceiling is accepted +
    cap_trim; compact (and any other code) censors it. `mode` is one `MODE_CODE` for
    every row or one per row. The one definition of the rule: `StepBatch.ceiling`, the
    numpy row fold (`aggregates.rows`) and the compiled one (`_rowfold.c`, held to this by
    tests/test_rowfold.py) all apply it.
    """
    mode = np.asarray(mode)
    accepted = np.asarray(accepted, dtype=np.int64)
    revealed = np.where(mode == MODE_CAP_ACCEPT, accepted + cap_trim, accepted)
    known = (mode == MODE_STATIC) | (mode == MODE_CAP_ACCEPT)
    return np.where(known, revealed, np.int64(-1)).astype(np.int64, copy=False)


#: The fields with a plain default (the others are forward_ct, gamma and the request columns).
_PLAIN_DEFAULTS = {f.name: f.default for f in fields(StepBatch) if f.default is not MISSING}


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def empty_request_columns(n: int, gamma: int) -> dict[str, np.ndarray]:
    """Default-filled per-request columns for `n` rows (unknowns as -1 / NaN)."""
    cols: dict[str, np.ndarray] = {}
    for name, dtype in REQUEST_COLUMNS.items():
        if dtype is object:
            cols[name] = np.full(n, None, dtype=object)
        elif dtype is np.float64:
            cols[name] = np.full(n, np.nan)
        else:
            cols[name] = np.full(n, -1, dtype=dtype)
    return cols


def step_field_names() -> list[str]:
    """Scalar (per-step) field names of `StepBatch`, in declaration order."""
    skip = (
        set(REQUEST_COLUMNS)
        | set(MATRIX_COLUMNS)
        | {
            "has_reqs",
            "workload_codes",
            "workload_names",
        }
    )
    return [f.name for f in fields(StepBatch) if f.name not in skip]


def step_scalar_fields(names: tuple[str, ...]) -> list[tuple[str, object, object]]:
    """`(name, type, default)` of the named step scalars, as `StepBatch` declares them.

    SGLang's wire record shares these fields with `StepBatch`; it is built from this
    declaration so the two cannot drift apart.
    """
    hints = get_type_hints(StepBatch)
    defaults = {f.name: f.default for f in fields(StepBatch)}
    return [(name, hints[name], defaults[name]) for name in names]
