"""The one number formatter: what every table, headline and verdict prints."""

from __future__ import annotations

import math

import pytest

from dspark_obs.numbers import bracket, delta, fmt, interval, number, p_value, percent, significant


@pytest.mark.parametrize(
    "value, digits, signed, want",
    [
        (None, 2, False, "—"),
        (math.nan, 2, False, "—"),
        (math.inf, 2, False, "—"),
        (30564, 2, False, "30,564"),
        (1234.5678, 2, False, "1,234.57"),
        (-0.0, 1, False, "0.0"),
        (-0.04, 1, False, "0.0"),
        (-0.04, 1, True, "0.0"),
        (0.04, 1, True, "0.0"),
        (0, 0, True, "0"),
        (12516.2, 0, True, "+12,516"),
        (-1.9, 1, True, "-1.9"),
        (True, 2, False, "yes"),
    ],
)
def test_number(value, digits, signed, want):
    assert number(value, digits, signed=signed) == want


def test_deltas_percents_and_intervals_share_the_rules():
    assert delta(-0.3) == "0" and delta(2.6) == "+3"
    assert percent(-0.0004, signed=True) == "0.0 %" and percent(0.215, signed=True) == "+21.5 %"
    assert interval(-0.2, 1900.4) == "0 – 1,900"
    assert interval(191.2, 191.24, 1, signed=True) == "+191.2 – +191.2"
    assert fmt("compact") == "compact" and fmt(None) == "—" and fmt(0.5) == "0.500"


def test_p_values_below_their_digits_say_so():
    assert p_value(0.0) == "<0.001" and p_value(0.00099) == "<0.001"
    assert p_value(0.001) == "0.001" and p_value(0.0456) == "0.046" and p_value(1.0) == "1.000"
    assert p_value(None) == "—"


def test_significant_digits_and_brackets():
    assert significant(0.000123456) == "0.000123" and significant(123456.7) == "123,457"
    assert significant(-0.117, signed=True) == "-0.117" and significant(0) == "0"
    assert bracket(-0.186, -0.051) == "[-0.186, -0.051]"
    assert bracket(0, 0) == "[0, 0]" and bracket(-1200, 35) == "[-1,200, +35]"
