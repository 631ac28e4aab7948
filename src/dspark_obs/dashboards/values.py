"""A value written the way Grafana writes it: scaled to its unit, to its decimals, in its colour.

A stat panel is read, not measured: `12.4 ms` in the colour of the threshold it
falls under, never `1.24e-02` on a bar. These rules follow Grafana's value
formatting for the units this dashboard uses (`percentunit`, `s`, `ops`, `short`,
`locale`, `none` and `suffix:`), and its named threshold colours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal, localcontext
from typing import Any

from ..numbers import number

#: Axis-label name and factor of each unit, for the timeseries and bar drawings.
UNITS = {
    "percentunit": ("%", 100.0),
    "s": ("seconds", 1.0),
    "ops": ("ops/s", 1.0),
    "short": ("count", 1.0),
    "locale": ("value", 1.0),
    "none": ("value", 1.0),
}

#: Grafana's named colours as it paints them (its classic palette).
NAMED_COLOURS = {
    "green": "#73BF69",
    "yellow": "#FADE2A",
    "red": "#F2495C",
    "blue": "#5794F2",
    "orange": "#FF9830",
    "purple": "#B877D9",
}

_TIME = ((1e-6, 1e9, "ns"), (1e-3, 1e6, "µs"), (1.0, 1e3, "ms"), (60.0, 1.0, "s"))
_SI = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))


def defaults(panel: Mapping[str, Any]) -> Mapping[str, Any]:
    return (panel.get("fieldConfig") or {}).get("defaults", {})


def unit_of(panel: Mapping[str, Any]) -> tuple[str, float]:
    unit = defaults(panel).get("unit") or "none"
    if unit.startswith("suffix:"):
        return unit.split(":", 1)[1].strip(), 1.0
    return UNITS.get(unit, (unit, 1.0))


def _number(value: float, decimals: int | None) -> str:
    """Fixed point, never an exponent; `decimals` None keeps about three significant digits."""
    if decimals is None:
        magnitude = math.floor(math.log10(abs(value))) if value else 0
        decimals = max(0, min(6, 2 - magnitude))
    return f"{value:.{decimals}f}"


def _si(value: float, decimals: int | None) -> tuple[str, str]:
    for factor, prefix in _SI:
        if abs(value) >= factor:
            return _number(value / factor, decimals), prefix
    return _number(value, decimals), ""


def _locale(value: float, decimals: int | None) -> str:
    """Grafana's `locale` unit, `value.toLocaleString(undefined, {maximumFractionDigits})` in
    an English locale: thousands separators, at most `decimals` decimals (3 unset) with
    trailing zeros dropped, rounded half away from zero from the shortest decimal that reads
    back as the same float, as browsers' ICU does (`1.005` to `1.01`, where `f"{1.005:.2f}"`
    gives `1.00`). Counts read `30,564`, never `30.6 K`; a value that rounds to zero has no
    sign (numbers.py)."""
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    digits = 3 if decimals is None else max(0, decimals)
    with localcontext() as ctx:
        ctx.prec = 400  # a float's integer part has at most 309 digits
        rounded = Decimal(repr(value)).quantize(Decimal(1).scaleb(-digits), ROUND_HALF_UP)
    text = number(rounded, digits)
    return text.rstrip("0").rstrip(".") if "." in text else text


def format_value(value: float, panel: Mapping[str, Any]) -> str:
    """`value` as a Grafana stat shows it, with the panel's unit and decimals."""
    if math.isnan(value):
        return "No data"
    unit = defaults(panel).get("unit") or "none"
    raw = defaults(panel).get("decimals")
    decimals = None if raw is None else int(raw)
    if unit == "percentunit":
        return f"{_number(100 * value, decimals)}%"
    if unit == "s":
        for below, factor, name in _TIME:
            if abs(value) < below:
                return f"{_number(value * factor, decimals)} {name}"
        return f"{_number(value, decimals)} s"
    if unit.startswith("suffix:"):
        return f"{_number(value, decimals)} {unit.split(':', 1)[1].strip()}"
    if unit == "locale":
        return _locale(value, decimals)
    if unit in ("short", "ops"):
        number, prefix = _si(value, decimals)
        text = f"{number} {prefix}".rstrip()
        return f"{text} ops/s" if unit == "ops" else text
    return _number(value, decimals)


def threshold_colour(value: float, panel: Mapping[str, Any]) -> str:
    """The colour of the highest threshold step at or below `value` (the base step's below all)."""
    steps = (defaults(panel).get("thresholds") or {}).get("steps") or [{"color": "green"}]
    colour = steps[0]["color"]
    for step in steps[1:]:
        if step.get("value") is not None and value >= step["value"]:
            colour = step["color"]
    return NAMED_COLOURS.get(colour, colour)
