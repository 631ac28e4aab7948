"""Numbers as people read them, the same in every table, report, figure and panel.

One formatter, so a figure cannot say `-0.0 %` where the table beside it says `0.0 %`,
nor a count print as `30564` in one place and `30,564` in the next. The rules:

- missing (None, NaN, infinity) is `—`, never `nan` or an empty cell;
- integers and fixed-point numbers carry thousands separators;
- a value that rounds to zero has no sign (`0.00`, not `-0.00`), with or without `+`;
- a p-value below what its digits can show is `<0.001`, not `0.000`.
"""

from __future__ import annotations

import math

DASH = "—"


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def number(value, digits: int = 2, *, signed: bool = False) -> str:
    """`value` with `digits` decimals (an int keeps none); `signed` puts `+` before a
    positive one, as a delta reads."""
    if _missing(value):
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    sign = "+" if signed else ""
    if isinstance(value, int):
        return f"{value:{sign},}" if value else "0"
    text = f"{value:{sign},.{digits}f}"
    if not any(c in "123456789" for c in text):
        return text.lstrip("+-")
    return text


def _decimals(x: float, sig: int) -> int:
    if x == 0 or not math.isfinite(x):
        return 0
    return max(0, sig - 1 - math.floor(math.log10(abs(x))))


def significant(value, sig: int = 3, *, signed: bool = False) -> str:
    """`value` to about `sig` significant digits, never in scientific notation."""
    if _missing(value):
        return DASH
    if value == 0:
        return "0"
    return number(float(value), _decimals(value, sig), signed=signed)


def bracket(lo: float, hi: float) -> str:
    """An interval as `[lo, hi]`, signed, both ends with the decimals the smaller needs."""
    nonzero = [abs(v) for v in (lo, hi) if v != 0]
    if not nonzero:
        return "[0, 0]"
    d = _decimals(min(nonzero), 2)
    return f"[{number(lo, d, signed=True)}, {number(hi, d, signed=True)}]"


def delta(value, digits: int = 0) -> str:
    """A difference, its sign always shown (`+1,234`, `-56`, `0`)."""
    return number(value, digits, signed=True)


def interval(lo, hi, digits: int = 0, *, signed: bool = False) -> str:
    """`lo – hi`, both as `number` gives them."""
    return f"{number(lo, digits, signed=signed)} – {number(hi, digits, signed=signed)}"


def percent(value, digits: int = 1, *, signed: bool = False) -> str:
    """A share (0.123) as `12.3 %`."""
    if _missing(value):
        return DASH
    return f"{number(100.0 * value, digits, signed=signed)} %"


def p_value(p, digits: int = 3) -> str:
    """A p-value: `<0.001` below what `digits` decimals show, else those decimals."""
    if _missing(p):
        return DASH
    floor = 10.0**-digits
    return f"<{floor:.{digits}f}" if p < floor else number(float(p), digits)


def fmt(value, digits: int = 3) -> str:
    """Any table cell: a number by `number`, anything else as it prints."""
    if value is None or isinstance(value, bool | int | float):
        return number(value, digits)
    return str(value)
