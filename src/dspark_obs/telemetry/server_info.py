"""Exact conversion between SGLang's `dspark_info_record` JSON and `StepBatch`.

The wire types mirror SGLang 0.5.23's `DecodeStepRecord` and `ReqDetail`
(msgspec structs with `omit_defaults`), field for field and in the same order,
so that decoding validates types the way the server encodes them and encoding
a batch back reproduces the server's JSON byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain, compress
from operator import attrgetter

import msgspec
import msgspec.structs
import numpy as np

from .. import extensions
from .batch import (
    MAX_GAMMA,
    MODES,
    STEP_INT_FIELDS,
    STEP_OPTIONAL_FLOAT_FIELDS,
    STEP_OPTIONAL_INT_FIELDS,
    InvalidBatch,
    StepBatch,
    empty_request_columns,
    step_scalar_fields,
)

#: Record components SGLang can dump (`SGLANG_DSPARK_DEBUG_DUMP`).
COMPONENTS = (
    "core",
    "step_cpu_time",
    "step_gpu_time",
    "draft_gpu_time",
    "target_verify_gpu_time",
    "reqs",
)


class ReqDetail(msgspec.Struct, omit_defaults=True):
    req_pool_index: int
    prefix_len: int
    verify_len: int
    acc_len: int
    correct_drafts: int
    cap_trim: int
    bonus_token: int
    draft_tokens: list[int]
    rid: str | None = None
    confidence: list[float] | None = None
    survival: list[float] | None = None


#: SGLang's step record fields after `forward_ct`, in its order (`mode` follows `bs` there).
_STEP_SCALARS = (
    "bs",
    "mode",
    *STEP_OPTIONAL_INT_FIELDS,
    *STEP_INT_FIELDS[1:],
    *STEP_OPTIONAL_FLOAT_FIELDS,
)

#: The step scalars a record hands to `StepBatch` as they are (all but `mode`).
_RECORD_SCALARS = (*STEP_INT_FIELDS, *STEP_OPTIONAL_INT_FIELDS, *STEP_OPTIONAL_FLOAT_FIELDS)

DecodeStepRecord = msgspec.defstruct(
    "DecodeStepRecord",
    [
        ("forward_ct", int),
        *step_scalar_fields(_STEP_SCALARS),
        ("reqs", list[ReqDetail] | None, None),
    ],
    omit_defaults=True,
    module=__name__,
)


class InfoRecord(msgspec.Struct):
    """The `dspark_info_record` object of one DP rank."""

    mode: str
    gamma: int
    verify_num_draft_tokens: int
    components: list[str]
    records: list[DecodeStepRecord]
    simulate_acc_len: int | None = None


#: Most data-parallel ranks one server's answer may list (see `check_rank_count`).
MAX_DP_RANKS = 256

#: `ReqDetail`'s integer fields, in SGLang's order.
REQ_INT_FIELDS = (
    "req_pool_index",
    "prefix_len",
    "verify_len",
    "acc_len",
    "correct_drafts",
    "cap_trim",
    "bonus_token",
)


class SGLangFormatError(InvalidBatch):
    """A payload that does not follow SGLang's documented record shape.

    An `InvalidBatch`, so it carries the `reason` label a source counts it under
    (`dspark_ingest_errors_total{reason=...}`): `bad_record` for a record that
    does not decode or convert, `bad_json` for undecodable bytes, or the
    telemetry model's own reason (`window_out_of_range`, ...) for a record
    that decodes but breaks DSpark's invariants.
    """

    def __init__(self, message: str, reason: str = "bad_record") -> None:
        super().__init__(reason, message)


WorkloadOf = Callable[[np.ndarray], np.ndarray]


def _no_workload(rids: np.ndarray) -> np.ndarray:
    return np.full(len(rids), "other", dtype=object)


def _sorted_codes(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct names of a column as text, sorted, and each row's index among them.

    What `np.unique(..., return_inverse=True)` gives, through a dictionary: a column
    holds a few names among thousands of rows, and sorting every row is the slow part.
    """
    keys = list(map(str, values.tolist()))
    names = sorted(set(keys))
    index = {name: i for i, name in enumerate(names)}
    return names, np.fromiter(map(index.__getitem__, keys), np.int64, len(keys))


def _categories(workload: np.ndarray) -> dict[str, object]:
    """A step's workload column in categorical form (`StepBatch.workload_codes` into
    `workload_names`, its distinct names sorted), so that the aggregates group its rows
    with a table lookup instead of sorting strings at every step."""
    names, codes = _sorted_codes(workload)
    return {"workload_codes": codes, "workload_names": tuple(names)}


def decode_info_record(payload: bytes | str | dict) -> InfoRecord:
    """Parse one rank's `dspark_info_record` (JSON text or an already-decoded dict)."""
    if not isinstance(payload, (bytes, str, dict)):
        # e.g. a rank whose dspark_info_record is null or a list in a damaged answer
        raise SGLangFormatError(f"not a dspark_info_record: a {type(payload).__name__}")
    try:
        if isinstance(payload, dict):
            return msgspec.convert(payload, InfoRecord)
        return msgspec.json.decode(payload, type=InfoRecord)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise SGLangFormatError(f"not a dspark_info_record: {exc}") from exc


def decode_step_record(raw: object) -> DecodeStepRecord:
    """One step record from its decoded JSON, or SGLangFormatError (`bad_record`).

    Sources decode an envelope's records one by one with this, so a record of
    the wrong shape costs that record only.
    """
    try:
        return msgspec.convert(raw, DecodeStepRecord)
    except (msgspec.ValidationError, TypeError) as exc:
        raise SGLangFormatError(f"not a step record: {exc}") from exc


def record_to_batch(
    rec: DecodeStepRecord,
    *,
    gamma: int,
    mode: str,
    rank: int = 0,
    workload_of: WorkloadOf = _no_workload,
) -> StepBatch:
    """One SGLang step record as a `StepBatch`.

    `mode` is the envelope's mode; a record's own `mode` wins where present.
    SGLang dumps carry no sampling parameters, so `greedy` is -1 and
    `temperature` NaN; no log-probabilities either.
    """
    step_mode = rec.mode or mode
    if step_mode not in MODES:
        raise SGLangFormatError(f"forward_ct {rec.forward_ct}: unknown mode {step_mode!r}")
    if not 1 <= gamma <= MAX_GAMMA:
        # before anything is sized by it: a corrupt gamma must not allocate [bs, gamma]
        raise SGLangFormatError(
            f"forward_ct {rec.forward_ct}: gamma {gamma} outside 1..{MAX_GAMMA}",
            "gamma_out_of_range",
        )
    scalars = {name: getattr(rec, name) for name in _RECORD_SCALARS}
    reqs = rec.reqs
    if reqs is None:
        # validated too: its step scalars reach the aggregates like any other step's
        return _validated(
            rec,
            StepBatch(
                forward_ct=rec.forward_ct,
                gamma=gamma,
                mode=step_mode,
                rank=rank,
                has_reqs=False,
                **scalars,
            ),
        )
    n = len(reqs)
    cols = empty_request_columns(n, gamma)
    try:
        for name in REQ_INT_FIELDS:
            cols[name] = np.fromiter((getattr(r, name) for r in reqs), dtype=np.int64, count=n)
    except OverflowError as exc:  # JSON integers are unbounded; int64 columns are not
        raise SGLangFormatError(f"forward_ct {rec.forward_ct}: {name} beyond int64") from exc
    cols["rid"] = np.array([r.rid for r in reqs] + [None], dtype=object)[:n]
    if n and all(r.rid is not None for r in reqs):
        cols["workload"] = workload_of(cols["rid"])
    else:
        cols["workload"] = np.full(n, "other", dtype=object)
    matrices: dict[str, np.ndarray | None] = {}
    try:
        matrices["draft_tokens"] = np.array([r.draft_tokens for r in reqs], dtype=np.int64).reshape(
            n, gamma
        )
        for name in ("confidence", "survival"):
            present = [getattr(r, name) is not None for r in reqs]
            if n and all(present):
                matrices[name] = np.array(
                    [getattr(r, name) for r in reqs], dtype=np.float64
                ).reshape(n, gamma)
            elif any(present):
                raise SGLangFormatError(f"forward_ct {rec.forward_ct}: {name} on some reqs only")
            else:
                matrices[name] = None
    except SGLangFormatError:
        raise
    except ValueError as exc:
        raise SGLangFormatError(
            f"forward_ct {rec.forward_ct}: per-position lists are not {gamma} long"
        ) from exc
    except OverflowError as exc:
        raise SGLangFormatError(f"forward_ct {rec.forward_ct}: draft token beyond int64") from exc
    batch = StepBatch(
        forward_ct=rec.forward_ct,
        gamma=gamma,
        mode=step_mode,
        rank=rank,
        **scalars,
        **cols,
        **_categories(cols["workload"]),
        **matrices,
    )
    return _validated(rec, batch)


def _validated(rec: DecodeStepRecord, batch: StepBatch) -> StepBatch:
    try:
        batch.validate()
    except InvalidBatch as exc:
        raise SGLangFormatError(f"forward_ct {rec.forward_ct}: {exc}", exc.reason) from exc
    return batch


def info_record_to_batches(
    payload: bytes | str | dict | InfoRecord,
    *,
    rank: int = 0,
    workload_of: WorkloadOf = _no_workload,
) -> list[StepBatch]:
    """Every step record of one rank's `dspark_info_record`, in server order.

    JSON text goes through `_columnar_batches` first: converting record by record
    costs a Python object per number and a loop per request. Whatever that path
    does not take (an error anywhere, or a valid but unusual spelling) is converted
    record by record, so results and errors are the same either way.
    """
    if isinstance(payload, (bytes, str)):
        batches = _columnar_batches(payload, rank, workload_of)
        if batches is not None:
            return batches
    info = payload if isinstance(payload, InfoRecord) else decode_info_record(payload)
    return [
        record_to_batch(rec, gamma=info.gamma, mode=info.mode, rank=rank, workload_of=workload_of)
        for rec in info.records
    ]


def _variant(base: type, name: str, **retyped: tuple[object, object]) -> type:
    """`base` with the named fields retyped (`(type, default)`), all else as in `base`.

    gc=False: decoding a poll creates tens of thousands of these, none in a cycle.
    """
    specs = []
    for f in msgspec.structs.fields(base):
        type_, default = retyped.get(f.name, (f.type, f.default))
        specs.append((f.name, type_) if default is msgspec.NODEFAULT else (f.name, type_, default))
    return msgspec.defstruct(name, specs, gc=False, module=__name__)


#: An absent list adds nothing to the joined text of a payload's lists.
_ABSENT = msgspec.Raw(b"")

# The wire types with the per-position lists kept as raw JSON text, to be parsed for
# all requests of a payload at once.
_ColumnarReq = _variant(
    ReqDetail,
    "_ColumnarReq",
    draft_tokens=(msgspec.Raw, msgspec.NODEFAULT),
    confidence=(msgspec.Raw, _ABSENT),
    survival=(msgspec.Raw, _ABSENT),
)
_ColumnarStep = _variant(DecodeStepRecord, "_ColumnarStep", reqs=(list[_ColumnarReq] | None, None))
_ColumnarInfo = _variant(
    InfoRecord, "_ColumnarInfo", records=(list[_ColumnarStep], msgspec.NODEFAULT)
)

_JSON_SPACE = b" \t\r\n"
_POW10 = np.array([float(10**k) for k in range(23)])
#: JSON lists run together as one comma-separated list (`[` separates, `]` is blank).
_UNBRACKET = bytes.maketrans(b"[]", b", ")
#: Integers below this parse exactly; numpy clamps what int64 cannot hold to above it.
_SAFE_INT = 10**18


#: the optional compiled parser (setup.py); without it (or with DSPARK_OBS_NO_EXTENSIONS),
#: msgspec and numpy do the work
_compiled = extensions.load("dspark_obs.telemetry._server_info_parser")
if _compiled is not None and _compiled.STEP_FIELDS != _RECORD_SCALARS:  # pragma: no cover
    # built from an older source: its tuples would be misread (tests/test_extensions.py
    # fails on this where the extensions are required)
    _compiled = None


class _Columns(msgspec.Struct, gc=False):
    """A payload's rows as payload-wide columns, before they are checked and sliced.

    `steps` holds one `(forward_ct, mode, number of reqs or None, *_RECORD_SCALARS)`
    tuple per step record, in server order; the rows of the steps with reqs follow one
    another in the columns.
    """

    mode: str
    gamma: int
    steps: list
    ints: dict
    rid: np.ndarray
    #: which rows have a rid; None when all do
    rid_present: np.ndarray | None
    #: (rids, index): the rid column is rids[index], with fewer rids than rows, so the
    #: workload is looked up once per rid; None where not known
    rid_index: tuple[np.ndarray, np.ndarray] | None
    draft: np.ndarray
    probs: dict
    #: every step passes `StepBatch.validate_step` as parsed (the compiled parser's types
    #: and forward_ct range), so `_assemble` need not check them again
    steps_checked: bool = False


def _columnar_batches(
    payload: bytes | str, rank: int, workload_of: WorkloadOf
) -> list[StepBatch] | None:
    """All steps of a payload from one parse and one numpy column per field.

    The rows of every step are gathered into payload-wide columns, checked once, and
    each step gets slices of them. The compiled parser reads the columns where it is
    built and the payload is in the plain form SGLang writes; otherwise msgspec and
    numpy do. Only the plainly valid is taken: None for a payload that neither takes,
    confidence present on some requests only, or a step `record_to_batch` would
    refuse. Those are left to it.
    """
    columns = _compiled_columns(payload) if _compiled is not None else None
    if columns is None:
        columns = _msgspec_columns(payload)
        if columns is None:
            return None
    return _assemble(columns, rank, workload_of)


def _compiled_columns(payload: bytes | str) -> _Columns | None:
    """The compiled parser's columns, or None where it declines (`_server_info_parser.c`)."""
    if isinstance(payload, str):
        try:
            payload = payload.encode()
        except UnicodeEncodeError:  # a lone surrogate: msgspec decides
            return None
    parsed = _compiled.parse(payload, MAX_GAMMA)
    if parsed is None:
        return None
    mode, gamma, steps, n, data, has_conf, has_surv, rids, all_rids = parsed
    # one buffer: the integer columns, the rid index, draft_tokens, then confidence and
    # survival if there
    k = len(REQ_INT_FIELDS)
    ints = np.frombuffer(data, dtype=np.int64, count=(k + 1 + gamma) * n)
    index = ints[k * n : (k + 1) * n]
    rid_values = np.array([*rids, None], dtype=object)
    floats = np.frombuffer(data, dtype=np.float64, offset=ints.nbytes)
    probs = {"confidence": None, "survival": None}
    for name, present in (("confidence", has_conf), ("survival", has_surv)):
        if present:
            probs[name], floats = floats[: n * gamma].reshape(n, gamma), floats[n * gamma :]
    return _Columns(
        mode=mode,
        gamma=gamma,
        steps=steps,
        ints=dict(zip(REQ_INT_FIELDS, ints[: k * n].reshape(k, n), strict=True)),
        rid=rid_values[index],  # index -1 (no rid) picks the None at the end
        rid_present=None if all_rids else index >= 0,
        rid_index=(rid_values[:-1], index) if all_rids else None,
        draft=ints[(k + 1) * n :].reshape(n, gamma),
        probs=probs,
        steps_checked=True,
    )


_step_tuple = attrgetter("forward_ct", "mode", *_RECORD_SCALARS)


def _msgspec_columns(payload: bytes | str) -> _Columns | None:
    """The columns from one msgspec decode, the per-position lists parsed by numpy."""
    try:
        info = msgspec.json.decode(payload, type=_ColumnarInfo)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    gamma = info.gamma
    if not 1 <= gamma <= MAX_GAMMA:
        return None
    reqs = list(chain.from_iterable(rec.reqs for rec in info.records if rec.reqs is not None))
    n = len(reqs)
    ints = {}
    try:
        for name in REQ_INT_FIELDS:
            ints[name] = np.fromiter(map(attrgetter(name), reqs), dtype=np.int64, count=n)
    except OverflowError:
        return None
    draft = _int_rows(b"".join(map(attrgetter("draft_tokens"), reqs)), n, gamma)
    if draft is None:
        return None
    probs: dict[str, np.ndarray | None] = {}
    for name in ("confidence", "survival"):
        text = b"".join(map(attrgetter(name), reqs))
        probs[name] = _float_rows(text, n, gamma) if text else None
        if text and probs[name] is None:
            return None
    rids = list(map(attrgetter("rid"), reqs))
    steps = []
    for rec in info.records:
        forward_ct, mode, *scalars = _step_tuple(rec)
        steps.append((forward_ct, mode, None if rec.reqs is None else len(rec.reqs), *scalars))
    return _Columns(
        mode=info.mode,
        gamma=gamma,
        steps=steps,
        ints=ints,
        rid=np.array([*rids, None], dtype=object)[:n],
        rid_present=None if None not in rids else np.array([r is not None for r in rids]),
        rid_index=None,
        draft=draft,
        probs=probs,
    )


def _assemble(columns: _Columns, rank: int, workload_of: WorkloadOf) -> list[StepBatch] | None:
    """The steps of a payload's columns, or None where `record_to_batch` must decide."""
    gamma, draft, probs, present = columns.gamma, columns.draft, columns.probs, columns.rid_present
    n = len(draft)
    # the columns no SGLang field fills, as `empty_request_columns` fills them
    cols = {
        name: np.full(n, col[0], dtype=col.dtype)
        for name, col in empty_request_columns(1, gamma).items()
        if name not in columns.ints and name not in ("rid", "workload")
    }
    cols.update(columns.ints)
    cols["rid"] = columns.rid
    if n and present is None and columns.rid_index is not None:
        # a workload per rid rather than per row, and its categories from those
        rids, index = columns.rid_index
        names = workload_of(rids)
        if names.shape != rids.shape:
            return None
        cols["workload"] = names[index]
        categories, codes = _sorted_codes(names)
        codes = codes[index]
    else:
        if n and present is None:
            cols["workload"] = workload_of(cols["rid"])
            if cols["workload"].shape != (n,):
                return None
        else:
            cols["workload"] = np.full(n, "other", dtype=object)
        categories, codes = _sorted_codes(cols["workload"])
    try:
        StepBatch(forward_ct=0, gamma=gamma, **cols, draft_tokens=draft, **probs).validate_rows()
    except InvalidBatch:
        return None
    counts = [0 if step[2] is None else step[2] for step in columns.steps]
    # which of the payload's workloads each step holds, for all steps at once: a step's
    # names are its own, as `_categories` of its column gives them
    holds = np.zeros((len(counts), len(categories)), dtype=bool)
    holds[np.repeat(np.arange(len(counts)), counts), codes] = True
    holds_all = holds.all(axis=1).tolist()
    all_names = tuple(categories)
    out = []
    start = 0
    for i, (forward_ct, mode, k, *values) in enumerate(columns.steps):
        step_mode = mode or columns.mode
        if step_mode not in MODES:
            return None
        fields = dict(zip(_RECORD_SCALARS, values, strict=True))
        fields.update(forward_ct=forward_ct, gamma=gamma, mode=step_mode, rank=rank)
        if k is None:
            fields["has_reqs"] = False
        else:
            if fields["bs"] not in (-1, k):
                return None
            rows = slice(start, start + k)
            start += k
            fields.update({name: col[rows] for name, col in cols.items()})
            fields["draft_tokens"] = draft[rows]
            for name, m in probs.items():
                fields[name] = None if m is None or not k else m[rows]
            if k and present is not None and present[rows].all():
                fields["workload"] = workload_of(fields["rid"])
                if fields["workload"].shape != (k,):
                    return None
                fields.update(_categories(fields["workload"]))
            elif k and holds_all[i]:
                fields["workload_codes"] = codes[rows]
                fields["workload_names"] = all_names
            elif k:
                # the payload's categories narrowed to those of this step
                seen = holds[i]
                fields["workload_codes"] = (np.cumsum(seen) - 1)[codes[rows]]
                fields["workload_names"] = tuple(compress(categories, seen))
            else:
                fields.update(_categories(fields["workload"]))
        batch = StepBatch(**fields) if k is None else StepBatch.from_columns(fields)
        if not columns.steps_checked:
            try:
                batch.validate_step()
            except InvalidBatch:
                return None
        out.append(batch)
    return out


def _rows(text: bytes, allowed: bytes, n: int, gamma: int) -> tuple[bytes, np.ndarray] | None:
    """`n` concatenated JSON lists without whitespace, and where each item ends; None
    unless each is a flat list of `gamma` items spelt with the characters in `allowed`.

    The text comes from msgspec, so each piece is one valid JSON value. Without
    letters or quotes, with `n` opening brackets, each at the start or right after
    a `]` (not nested, no bare number between lists) and none right before a `]`
    (not empty), the pieces are `n` flat lists of plain numbers; every item ends at a
    `,` or `]`, so with `n * gamma` ends and every gamma-th a `]`, each list is
    `gamma` long.
    """
    rest = text.translate(None, allowed)
    if rest:
        if rest.translate(None, _JSON_SPACE):
            return None
        text = text.translate(None, _JSON_SPACE)
    chars = np.frombuffer(text, dtype=np.uint8)
    opens = np.flatnonzero(chars == ord("["))
    ends = np.flatnonzero((chars == ord(",")) | (chars == ord("]")))
    if (
        len(opens) != n
        or len(ends) != n * gamma
        or opens[0] != 0
        or (chars[opens[1:] - 1] != ord("]")).any()
        or (chars[opens + 1] == ord("]")).any()
        or (chars[ends[gamma - 1 :: gamma]] != ord("]")).any()
    ):
        return None
    return text, ends


def _int_rows(text: bytes, n: int, gamma: int) -> np.ndarray | None:
    """`n` concatenated JSON lists of `gamma` non-negative integers as an [n, gamma] matrix."""
    if not n:
        return np.empty((0, gamma), dtype=np.int64)
    rows = _rows(text, b"0123456789,[]", n, gamma)
    if rows is None:
        return None
    values = np.fromstring(rows[0].translate(_UNBRACKET)[1:], dtype=np.int64, sep=",")
    if len(values) != n * gamma or (values >= _SAFE_INT).any():
        return None
    return values.reshape(n, gamma)


def _float_rows(text: bytes, n: int, gamma: int) -> np.ndarray | None:
    """`n` concatenated JSON lists of `gamma` non-negative decimals as an [n, gamma] matrix.

    numpy's own text-to-float is several times slower than its integer parsing, so a
    decimal `d.ddd` is read as the integer `dddd` over a power of ten. With both
    exact in float64 (below 2**53, at most 10**22) the one IEEE division rounds to the
    same double that parsing the decimal does; anything else is None.
    """
    rows = _rows(text, b"0123456789.,[]", n, gamma)
    if rows is None:
        return None
    text, ends = rows
    dots = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == ord("."))
    # a JSON number has at most one dot: as many dots as numbers means one in each
    token = np.arange(len(ends)) if len(dots) == len(ends) else np.searchsorted(ends, dots)
    decimals = np.zeros(len(ends), dtype=np.int64)
    decimals[token] = ends[token] - dots - 1
    mantissa = np.fromstring(text.translate(_UNBRACKET, b".")[1:], dtype=np.int64, sep=",")
    if len(mantissa) != n * gamma or (mantissa >= 2**53).any() or (decimals >= len(_POW10)).any():
        return None
    return (mantissa / _POW10[decimals]).reshape(n, gamma)


def batch_to_record(batch: StepBatch, *, step_mode: bool = True) -> DecodeStepRecord:
    """A `StepBatch` as SGLang's step record (the fields SGLang knows, nothing else).

    `step_mode=False` leaves the record's `mode` unset, as SGLang does when the
    `core` component is off.
    """
    reqs = None
    if batch.has_reqs:
        draft = batch.draft_tokens
        if draft is None:
            raise ValueError("SGLang's reqs records need draft_tokens")
        ints = {name: getattr(batch, name).tolist() for name in REQ_INT_FIELDS}
        draft_rows = draft.tolist()
        conf = None if batch.confidence is None else batch.confidence.tolist()
        surv = None if batch.survival is None else batch.survival.tolist()
        rids = batch.rid.tolist()
        reqs = [
            ReqDetail(
                req_pool_index=ints["req_pool_index"][i],
                prefix_len=ints["prefix_len"][i],
                verify_len=ints["verify_len"][i],
                acc_len=ints["acc_len"][i],
                correct_drafts=ints["correct_drafts"][i],
                cap_trim=ints["cap_trim"][i],
                bonus_token=ints["bonus_token"][i],
                draft_tokens=draft_rows[i],
                rid=rids[i],
                confidence=None if conf is None else conf[i],
                survival=None if surv is None else surv[i],
            )
            for i in range(batch.num_reqs)
        ]
    return DecodeStepRecord(
        forward_ct=int(batch.forward_ct),
        bs=int(batch.bs),
        mode=batch.mode if step_mode else "",
        budget=None if batch.budget is None else int(batch.budget),
        lag_steps=None if batch.lag_steps is None else int(batch.lag_steps),
        num_running_reqs=int(batch.num_running_reqs),
        num_verify_tokens=int(batch.num_verify_tokens),
        verify_tokens_local=int(batch.verify_tokens_local),
        verify_tokens_dp_synced=int(batch.verify_tokens_dp_synced),
        verify_tokens_graph_key=int(batch.verify_tokens_graph_key),
        **{name: _float_or_none(getattr(batch, name)) for name in STEP_OPTIONAL_FLOAT_FIELDS},
        reqs=reqs,
    )


def _float_or_none(value: float | None) -> float | None:
    return None if value is None else float(value)


def batches_to_info_record(
    batches: Sequence[StepBatch] | Iterable[StepBatch],
    *,
    mode: str,
    gamma: int,
    components: Sequence[str] = ("core", "reqs"),
    simulate_acc_len: int | None = None,
) -> dict:
    """Steps of one rank as the `dspark_info_record` object `GET /server_info` returns."""
    unknown = set(components) - set(COMPONENTS)
    if unknown:
        raise ValueError(f"unknown record components {sorted(unknown)}; valid: {COMPONENTS}")
    with_core = "core" in components
    records = [batch_to_record(b, step_mode=with_core) for b in batches]
    return {
        "mode": mode,
        "gamma": gamma,
        "verify_num_draft_tokens": gamma + 1,
        "components": sorted(components),
        "simulate_acc_len": simulate_acc_len,
        "records": msgspec.to_builtins(records),
    }


def check_rank_count(states: list) -> None:
    """Refuse an answer listing more DP ranks than any deployment has.

    Each rank becomes a `rank` label value and its own aggregate groups, so a
    damaged answer with thousands of entries would blow up both the series
    count and the cost of every update.
    """
    if len(states) > MAX_DP_RANKS:
        raise SGLangFormatError(
            f"server_info lists {len(states)} ranks, more than {MAX_DP_RANKS}", "too_many_ranks"
        )


def server_info_ranks(payload: bytes | str | dict) -> list[dict | None]:
    """Each DP rank's `dspark_info_record` in a `GET /server_info` answer (None if absent)."""
    try:
        data = msgspec.json.decode(payload) if isinstance(payload, (bytes, str)) else payload
    except msgspec.DecodeError as exc:
        raise SGLangFormatError(f"server_info is not JSON: {exc}", "bad_json") from exc
    states = data.get("internal_states") if isinstance(data, dict) else None
    if not isinstance(states, list):
        raise SGLangFormatError("server_info has no internal_states list", "bad_json")
    check_rank_count(states)
    return [s.get("dspark_info_record") if isinstance(s, dict) else None for s in states]
