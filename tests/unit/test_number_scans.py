"""The number scans of app/gateways/limits.py: the quick test for a digit followed by an "e" changes
no answer (the scans agree with the substring searches they replace, on any bytes), and no body
that holds a 19-digit run or a three-digit exponent is cleared."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from app.gateways.limits import _NUMBERISH, FLOAT_MAX, long_numbers, unreadable

LONG = re.compile(rb"[0-9]{19}|[0-9][eE][+\-]?[0-9]{3}")  # the rule, over the bytes as sent
numberish = st.lists(st.sampled_from(list(b'0123456789eE+-."a ,:{}')), max_size=80).map(bytes)


def searched(raw: bytes, exponents: tuple[bytes, ...]) -> bool:
    """Each exponent searched for on its own, as before the quick test."""
    translated = raw.translate(_NUMBERISH)
    return b"0" * 19 in translated or any(e in translated for e in exponents)


@given(numberish)
def test_long_numbers_agrees_with_the_searches_and_misses_no_long_number(raw: bytes) -> None:
    assert long_numbers(raw) == searched(raw, (b"0e000", b"0e+000", b"0e.000"))
    if LONG.search(raw):
        assert long_numbers(raw)


numbers = st.builds(lambda m, f, e, sign, x: f"{m}{'.' + f if f else ''}{e}{sign}{x}".encode(),
                    st.integers(0, 99999), st.sampled_from(["", "5", "123"]), st.sampled_from(["e", "E"]),
                    st.sampled_from(["", "+", "-"]), st.integers(0, 1200))


@given(numbers, st.booleans())
def test_unreadable_refuses_exactly_the_numbers_past_float_max(number: bytes, negative: bool) -> None:
    raw = b'{"a": [1, {"b": ' + (b"-" if negative else b"") + number + b"}]}"
    assert (unreadable(raw) is not None) == (abs(float(number)) >= FLOAT_MAX)


def test_unreadable_and_long_numbers_still_find_the_numbers_behind_the_quick_test() -> None:
    assert unreadable(b'{"amount": 1e999}') is not None
    assert unreadable(b'{"amount": 1E+999}') is not None
    assert unreadable(b'{"amount": 1e99}') is None
    assert long_numbers(b'{"amount": -1e-999}')
