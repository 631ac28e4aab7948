"""All steps of one `dspark_info_record` payload from one parse, column by column.

Converting record by record (`server_info_wire.record_to_batch`) costs a Python object
per number and a loop per request. Here the rows of every step are gathered into
payload-wide columns, checked once, and each step gets slices of them: the compiled
parser (`_server_info_parser.c`) reads the columns where it is built and the payload
is in the plain form SGLang writes; otherwise msgspec and numpy do. Whatever neither
takes is left to the per-record conversion, so results and errors are the same
whichever path runs (tests/test_sglang_compiled.py, tests/test_sglang_columnar.py).
"""

from __future__ import annotations

from itertools import chain, compress
from operator import attrgetter

import msgspec
import msgspec.structs
import numpy as np

from .. import extensions
from .batch import MAX_GAMMA, MODES, InvalidBatch, StepBatch, empty_request_columns
from .server_info_wire import (
    _RECORD_SCALARS,
    REQ_INT_FIELDS,
    DecodeStepRecord,
    InfoRecord,
    ReqDetail,
    WorkloadOf,
    _categories,
    _sorted_codes,
)


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
    #: every step's integers pass `StepBatch.validate_step` as parsed (the compiled
    #: parser's types and forward_ct range), so `_assemble` checks only its times
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
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
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
        try:
            batch.validate_times() if columns.steps_checked else batch.validate_step()
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
