"""The compiled parser of `dspark_info_record` JSON (`telemetry/_server_info_parser.c`).

Whatever it takes must come out exactly as the Python paths make it (the msgspec
columnar decode and the record-by-record one), down to the bits of every double;
whatever it declines must end exactly as they end, error reason and message
included. Payloads are generated in SGLang's shape and then spelt in every way
JSON allows (whitespace, key order, escapes, number spellings), damaged, cut
short, and fed in as raw bytes; nothing may crash. Without the extension (an
install without a C compiler) the Python path must give the same answers.
"""

from __future__ import annotations

import json
import random
import re
import struct

import msgspec
import msgspec.structs
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dspark_obs.telemetry import server_info_columnar as columnar
from dspark_obs.telemetry import server_info_wire as wire
from dspark_obs.telemetry.batch import STEP_OPTIONAL_FLOAT_FIELDS
from dspark_obs.telemetry.server_info import MAX_GAMMA, info_record_to_batches

from .test_sglang_columnar import (
    WORKLOAD_OF,
    assert_same,
    outcome,
    per_record,
    random_payload,
    random_request,
)

compiled = columnar._compiled
needs_compiled = pytest.mark.skipif(
    compiled is None, reason="extension not built or DSPARK_OBS_NO_EXTENSIONS is set"
)

SETTINGS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)

FLOAT_SLOTS = {"confidence", "survival", *STEP_OPTIONAL_FLOAT_FIELDS}
SPACE = ["", "", "", "", " ", "\n", "\t", "\r\n  ", "  "]


# -- spelling a payload in all the ways JSON allows ----------------------------------


def spell_float(x: float, rng: random.Random) -> str:
    if x == 0 and rng.random() < 0.3:
        return rng.choice(["-0.0", "0.0e5", "-0e0", "0E-3", "0.000"])
    return rng.choice([repr(x), repr(x), f"{x:.17g}", f"{x:.17e}", f"{x:.6E}", f"{x:.3f}"])


def spell_int(x: int, rng: random.Random, float_slot: bool) -> str:
    if float_slot and rng.random() < 0.3:
        return rng.choice([f"{x}.0", f"{x}e0", f"{x}E+00", f"{x}0e-1"])
    if x == 0 and rng.random() < 0.2:
        return "-0"
    return str(x)


def spell_str(s: str, rng: random.Random) -> str:
    text = json.dumps(s, ensure_ascii=rng.random() < 0.5)
    if rng.random() < 0.3:  # escape a character JSON lets through as it is
        inner = text[1:-1]
        if inner:
            i = rng.randrange(len(inner))
            c = inner[i]
            if c not in '\\"' and (i == 0 or inner[i - 1] != "\\"):
                esc = "\\/" if c == "/" else f"\\u{ord(c):04x}" if ord(c) < 0x10000 else c
                text = '"' + inner[:i] + esc + inner[i + 1 :] + '"'
    return text


def spell(obj, rng: random.Random, float_slot: bool = False) -> str:
    def ws() -> str:
        return rng.choice(SPACE)

    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "true" if obj else "false"
    if isinstance(obj, int):
        return spell_int(obj, rng, float_slot)
    if isinstance(obj, float):
        return spell_float(obj, rng)
    if isinstance(obj, str):
        return spell_str(obj, rng)
    if isinstance(obj, list):
        return "[" + ws() + ",".join(ws() + spell(v, rng, float_slot) + ws() for v in obj) + "]"
    items = list(obj.items())
    if rng.random() < 0.3:
        rng.shuffle(items)
    return (
        "{"
        + ws()
        + ",".join(
            ws() + json.dumps(k) + ws() + ":" + ws() + spell(v, rng, k in FLOAT_SLOTS) + ws()
            for k, v in items
        )
        + "}"
        + ws()
    )


@st.composite
def payloads(draw) -> tuple[dict, set[str]]:
    """A payload in SGLang's shape, with the features the compiled parser must get right
    (and which of `FEATURES` it has)."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    payload = random_payload(rng)
    gamma = payload["gamma"]
    bs = draw(st.sampled_from([None, 1, 1, 2, 64]))
    probs = draw(st.booleans())
    if bs is not None:  # a fixed batch of the same requests, in the same order each step
        base = [random_request(rng, gamma, probs, rid=True) for _ in range(bs)]
        for rec in payload["records"]:
            if "reqs" in rec:
                rec["reqs"] = [
                    {**r, "prefix_len": r["prefix_len"] + rec["forward_ct"]} for r in base
                ]
                rec["bs"] = bs
    reqs = [r for rec in payload["records"] for r in rec.get("reqs") or ()]
    features = draw(st.sets(st.sampled_from(sorted(FEATURES))))
    for feature in sorted(features):
        FEATURES[feature](rng, payload, reqs)
    if draw(st.booleans()):  # probabilities as SGLang rounds them (the fast number path)
        for r in reqs:
            for name in ("confidence", "survival"):
                if r.get(name):
                    r[name] = [round(x, 4) for x in r[name]]
    return payload, features


#: Values of fields this parser does not know, that it skips.
PLAIN_VALUES = [1.5, -2, 10**30, None, True, False, "x", "", [], [1, 2.5e-3, "b", None, False]]


def _some(rng, reqs):
    return rng.sample(reqs, min(len(reqs), rng.randint(1, 3))) if reqs else []


FEATURES = {
    "unicode rid": lambda rng, p, reqs: [
        r.update(rid=rng.choice(["chat-é", "code-😀", 'poetry-"q"', "chat-\\\n\u0000", "x/y"]))
        for r in _some(rng, reqs)
    ],
    "null rid": lambda rng, p, reqs: [r.update(rid=None) for r in _some(rng, reqs)],
    "no rid": lambda rng, p, reqs: [r.pop("rid", None) for r in _some(rng, reqs)],
    "null confidence": lambda rng, p, reqs: [r.update(confidence=None) for r in reqs],
    "no confidence": lambda rng, p, reqs: [r.pop("confidence", None) for r in reqs],
    "null reqs": lambda rng, p, reqs: [rec.update(reqs=None) for rec in p["records"][:1]],
    "null budget": lambda rng, p, reqs: [rec.update(budget=None) for rec in p["records"]],
    "huge draft": lambda rng, p, reqs: [
        r["draft_tokens"].__setitem__(0, rng.choice([2**63 - 1, 10**18, 2**63, 2**64 + 5]))
        for r in _some(rng, reqs)
    ],
    "huge prefix": lambda rng, p, reqs: [
        r.update(prefix_len=rng.choice([2**62, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1]))
        for r in _some(rng, reqs)
    ],
    "negative draft": lambda rng, p, reqs: [
        r["draft_tokens"].__setitem__(-1, -rng.randint(0, 2**63)) for r in _some(rng, reqs)
    ],
    "full doubles": lambda rng, p, reqs: [
        r.update(confidence=[rng.random() for _ in r["draft_tokens"]])
        for r in reqs
        if "confidence" in r
    ],
    "tiny doubles": lambda rng, p, reqs: [
        r.update(
            confidence=[rng.choice([1e-300, 5e-324, 2.5e-308, 1e-7]) for _ in r["draft_tokens"]]
        )
        for r in reqs
        if "confidence" in r
    ],
    "negative zero": lambda rng, p, reqs: [
        r.update(confidence=[-0.0] * len(r["draft_tokens"])) for r in reqs if "confidence" in r
    ],
    "step floats": lambda rng, p, reqs: [
        rec.update(
            step_gpu_ms=rng.choice([1e300, 1e-300, 0.1, -0.0, 3, 2**60, 12.345678901234567]),
            predicted_theta=rng.random() * 10 ** rng.randint(-30, 30),
        )
        for rec in p["records"]
    ],
    "trimmed windows": lambda rng, p, reqs: [
        r.update(verify_len=1, correct_drafts=0, acc_len=1, cap_trim=0) for r in _some(rng, reqs)
    ],
    "step modes": lambda rng, p, reqs: [
        rec.update(mode=rng.choice(["", "static", "cap-accept"])) for rec in p["records"]
    ],
    "unknown key": lambda rng, p, reqs: [
        r.update(extra=[1, {"a": None}]) for r in _some(rng, reqs)
    ],
    # fields a newer SGLang might add: plain values are skipped, as msgspec skips them
    "new plain keys": lambda rng, p, reqs: [
        p.update(sglang_version="0.5.24"),
        *(rec.update(spec_ms=rng.choice(PLAIN_VALUES)) for rec in p["records"]),
        *(r.update(logit_ms=rng.choice(PLAIN_VALUES)) for r in _some(rng, reqs)),
    ],
    "simulate_acc_len": lambda rng, p, reqs: p.update(simulate_acc_len=rng.choice([None, 3])),
    "timed components": lambda rng, p, reqs: p.update(components=["core", "reqs", "step_gpu_time"]),
}


def outcomes(text):
    """What the path with the extension, the one without, and the per-record one make of it."""
    with_c = outcome(lambda: info_record_to_batches(text, rank=3, workload_of=WORKLOAD_OF))
    saved = columnar._compiled
    columnar._compiled = None
    try:
        without = outcome(lambda: info_record_to_batches(text, rank=3, workload_of=WORKLOAD_OF))
    finally:
        columnar._compiled = saved
    return with_c, without, outcome(lambda: per_record(text, 3))


def assert_all_same(text):
    with_c, without, ref = outcomes(text)
    assert_same(with_c, ref)
    assert_same(without, ref)
    if not isinstance(ref, tuple):
        for a, b in zip(with_c, ref, strict=True):
            for name in ("draft_tokens", "confidence", "survival", "prefix_len"):
                x, y = getattr(a, name), getattr(b, name)
                assert x is None or x.flags.writeable == y.flags.writeable, name
    return ref


# -- equality on generated payloads ---------------------------------------------------


@needs_compiled
@SETTINGS
@given(payloads(), st.integers(0, 2**32))
def test_equal_to_the_python_paths(generated, seed):
    payload, _ = generated
    rng = random.Random(seed)
    for text in (msgspec.json.encode(payload), spell(payload, rng), spell(payload, rng).encode()):
        assert_all_same(text)


@needs_compiled
@SETTINGS
@given(payloads())
def test_plain_payloads_are_taken(generated):
    """SGLang's own spelling (msgspec: compact, its key order) of what it sends is taken:
    only what it never writes (unknown keys, subnormals, ...) or cannot hold falls back."""
    payload, features = generated
    if features & {"unknown key", "tiny doubles", "step floats", "huge draft", "huge prefix"}:
        return
    text = msgspec.json.encode(payload)
    if mixed_confidence(payload) or isinstance(outcome(lambda: per_record(text)), tuple):
        return  # invalid for the columnar paths: declined, and checked elsewhere
    assert compiled.parse(text, MAX_GAMMA) is not None


def mixed_confidence(payload: dict) -> bool:
    reqs = [r for rec in payload["records"] for r in rec.get("reqs") or ()]
    return any(
        0 < sum(r.get(name) is not None for r in reqs) < len(reqs)
        for name in ("confidence", "survival")
    )


# -- numbers and strings, one at a time ------------------------------------------------

NUMBER = r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?"


def step_payload(field: str, text: bytes) -> bytes:
    return (
        b'{"mode":"compact","gamma":1,"verify_num_draft_tokens":2,"components":[],'
        b'"records":[{"forward_ct":0,"' + field.encode() + b'":' + text + b"}]}"
    )


def list_payload(text: bytes) -> bytes:
    return (
        b'{"mode":"compact","gamma":1,"verify_num_draft_tokens":2,"components":[],'
        b'"records":[{"forward_ct":0,"reqs":[{"req_pool_index":0,"prefix_len":0,'
        b'"verify_len":1,"acc_len":1,"correct_drafts":0,"cap_trim":0,"bonus_token":0,'
        b'"draft_tokens":[0],"confidence":[' + text + b"]}]}]}"
    )


def compiled_step_value(field: str, text: bytes):
    parsed = compiled.parse(step_payload(field, text), MAX_GAMMA)
    if parsed is None:
        return None
    return parsed[2][0][3 + compiled.STEP_FIELDS.index(field)]


def compiled_list_value(text: bytes):
    parsed = compiled.parse(list_payload(text), MAX_GAMMA)
    if parsed is None:
        return None
    data, n = parsed[4], parsed[3]
    return struct.unpack_from("<d", data, 8 * (8 * n + 1))[0]  # after 8 int columns, draft


def msgspec_value(text, type_):
    """What msgspec decodes `text` to as `type_`, or "error"."""
    try:
        return msgspec.json.decode(text, type=type_)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return "error"


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


@needs_compiled
@SETTINGS
@given(st.one_of(st.from_regex(NUMBER, fullmatch=True), st.floats().map(repr)))
@example("0.1234")
@example("-0.0")
@example("-0")
@example("1e-400")
@example("1.7976931348623159e308")
@example("123456789012345678901234567890")
@example("9007199254740993")
@example("9007199254740993.0")
@example("0.30000000000000004")
@example("2.4703282292062328e-324")
@example("1e23")
@example("8.98846567431158e307")
def test_doubles_equal_msgspec_bit_for_bit(text):
    ref = msgspec_value(text.encode(), float | None)
    for value in (
        compiled_step_value("step_gpu_ms", text.encode()),
        compiled_list_value(text.encode()),
    ):
        if ref == "error":
            assert value is None
        elif value is not None:
            assert bits(value) == bits(ref), (text, value, ref)
    digits = len(text.replace(".", ""))
    if re.fullmatch(r"(0|[1-9][0-9]*)(\.[0-9]+)?", text) and digits <= 15:
        assert compiled_list_value(text.encode()) is not None, text  # the fast path


@needs_compiled
@SETTINGS
@given(st.one_of(st.from_regex(NUMBER, fullmatch=True), st.integers().map(str)))
@example(str(2**63 - 1))
@example(str(2**63))
@example(str(-(2**63)))
@example(str(-(2**63) - 1))
@example("-0")
@example("0123")
def test_integers_exact_or_declined(text):
    ref = msgspec_value(text.encode(), int | None)
    value = compiled_step_value("budget", text.encode())
    if ref == "error" or not -(2**63) <= ref < 2**63:
        assert value is None
    else:
        assert value == ref and type(value) is int
        if len(text) <= 18:
            assert value is not None


@needs_compiled
@SETTINGS
@given(
    st.one_of(
        st.text().map(lambda s: json.dumps(s).encode()),
        st.text().map(lambda s: json.dumps(s, ensure_ascii=False).encode("utf-8", "surrogatepass")),
        st.binary().map(lambda b: b'"' + b + b'"'),  # raw: escapes or bad UTF-8 included
    )
)
@example(b'"\\ud800"')
@example(b'"\xed\xa0\x80"')
@example(b'"a\\ud83d\\ude00"')
@example(b'"\\ud83d"')
@example(b'"\\u00e9\\/\\"\\\\"')
def test_strings_equal_msgspec(text):
    ref = msgspec_value(text, str)
    parsed = compiled.parse(step_payload("mode", text), MAX_GAMMA)
    if ref == "error":
        assert parsed is None
    elif parsed is not None:
        assert parsed[2][0][1] == ref
    if ref != "error":
        assert parsed is not None


# -- damage: cut, flipped, spliced ----------------------------------------------------

JSON_BYTES = b'{}[],:"\\-.eE019 \nnul\x00\xff\xc3'


@st.composite
def damaged(draw) -> bytes:
    rng = random.Random(draw(st.integers(0, 2**32)))
    payload = random_payload(rng)
    text = bytearray(
        msgspec.json.encode(payload) if rng.random() < 0.5 else spell(payload, rng).encode()
    )
    for _ in range(draw(st.integers(1, 4))):
        if not text:
            break
        i = rng.randrange(len(text))
        kind = draw(st.sampled_from(["cut", "flip", "insert", "delete", "duplicate"]))
        if kind == "cut":
            del text[i:]
        elif kind == "flip":
            text[i] = rng.choice(JSON_BYTES)
        elif kind == "insert":
            text[i:i] = bytes([rng.choice(JSON_BYTES)])
        elif kind == "delete":
            del text[i : i + rng.randint(1, 20)]
        else:
            text[i:i] = text[i : i + rng.randint(1, 200)]
    return bytes(text)


@needs_compiled
@settings(SETTINGS, max_examples=300)
@given(damaged())
def test_damaged_payloads_end_as_the_python_paths(text):
    assert_all_same(text)


@needs_compiled
@settings(SETTINGS, max_examples=200)
@given(st.binary(max_size=300))
@example(b"")
@example(b"{")
@example(b'{"mode"')
@example(b'{"records":[{"reqs":[{"draft_tokens":[1')
@example(b'{"mode":"compact","gamma":1,"verify_num_draft_tokens":2,"components":["\\')
def test_raw_bytes_never_crash(text):
    assert_all_same(text)


@needs_compiled
@pytest.mark.parametrize("value", PLAIN_VALUES)
@pytest.mark.parametrize("level", ["envelope", "record", "request"])
def test_unknown_fields_with_plain_values_are_skipped(level, value):
    """A field a newer SGLang adds keeps the payload on the compiled path, with the same
    result; one whose value is not plain (an object, a nested list) is declined."""
    payload = random_payload(random.Random(3))
    rec = next(rec for rec in payload["records"] if rec.get("reqs"))
    target = {"envelope": payload, "record": rec, "request": rec["reqs"][0]}[level]
    for extra, taken in ((value, True), ({"a": value}, False), ([[value]], False)):
        target["new_field"] = extra
        text = msgspec.json.encode(payload)
        assert (compiled.parse(text, MAX_GAMMA) is not None) == taken
        assert_all_same(text)


@needs_compiled
def test_lists_longer_than_any_gamma_are_declined():
    for k in (MAX_GAMMA, MAX_GAMMA + 1, 10_000):
        text = list_payload(b",".join([b"0.5"] * k))
        assert compiled.parse(text, MAX_GAMMA) is None
        assert_all_same(text)


@needs_compiled
def test_deep_nesting_and_long_tokens_are_declined():
    for text in (
        b"[" * 100_000,
        step_payload("step_gpu_ms", b"1" * 100_000),
        step_payload("step_gpu_ms", b"0." + b"1" * 100_000),
        step_payload("step_gpu_ms", b"1e" + b"9" * 10_000),
        step_payload("mode", b'"' + b"\\u0041" * 50_000 + b'"'),
    ):
        parsed = compiled.parse(text, MAX_GAMMA)
        assert parsed is None or parsed[2][0][1] == "A" * 50_000
        assert_all_same(text)


@needs_compiled
def test_results_do_not_share_memory_between_calls():
    """The parser keeps its work buffers between calls; what it returns is its own."""
    rng = random.Random(5)
    payload = random_payload(rng)
    while not any(rec.get("reqs") for rec in payload["records"]):
        payload = random_payload(rng)
    first = info_record_to_batches(msgspec.json.encode(payload), workload_of=WORKLOAD_OF)
    kept = [b.draft_tokens.copy() for b in first if b.draft_tokens is not None]
    other = random_payload(random.Random(6))
    info_record_to_batches(msgspec.json.encode(other), workload_of=WORKLOAD_OF)
    again = [b.draft_tokens for b in first if b.draft_tokens is not None]
    assert all(np.array_equal(a, b) for a, b in zip(kept, again, strict=True))


# -- the parser's keys are the wire types' fields --------------------------------------


def test_the_parsers_keys_are_the_wire_types_fields():
    """The keys the C parser takes, in SGLang's order, are `ReqDetail`'s, `DecodeStepRecord`'s
    and `InfoRecord`'s JSON names: a field added to a wire type fails here until the parser
    knows it."""
    parser = pytest.importorskip(
        "dspark_obs.telemetry._server_info_parser", reason="the extension is not built"
    )

    def keys(struct) -> tuple[str, ...]:
        return tuple(f.encode_name for f in msgspec.structs.fields(struct))

    assert parser.REQ_KEYS == keys(wire.ReqDetail)
    assert parser.REQ_KEYS[: len(wire.REQ_INT_FIELDS)] == wire.REQ_INT_FIELDS
    assert parser.RECORD_KEYS == keys(wire.DecodeStepRecord)
    assert parser.ENVELOPE_KEYS == keys(wire.InfoRecord)
    assert parser.STEP_FIELDS == wire._RECORD_SCALARS


# -- without the extension -------------------------------------------------------------


def test_python_path_without_the_extension(monkeypatch):
    """An install without a C compiler: the same answers from msgspec and numpy."""
    rng = random.Random(11)
    texts = [spell(random_payload(rng), rng) for _ in range(20)]
    with_c = [
        outcome(lambda t=t: info_record_to_batches(t, workload_of=WORKLOAD_OF)) for t in texts
    ]
    monkeypatch.setattr(columnar, "_compiled", None)
    monkeypatch.setattr(columnar, "_compiled_columns", None)  # would fail if still called
    for text, expected in zip(texts, with_c, strict=True):
        got = outcome(lambda t=text: info_record_to_batches(t, workload_of=WORKLOAD_OF))
        assert_same(got, expected)
        assert_same(got, outcome(lambda t=text: per_record(t)))
