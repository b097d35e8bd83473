"""The benchmarks' run order: no mode or variant always runs later on a stack than another."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from bench.ab import turned
from bench.e2e import MODES, designs


@given(st.integers(min_value=0, max_value=1000))
def test_a_round_is_the_baseline_both_modes_and_the_baseline_again(round_no: int) -> None:
    runs = designs(round_no)
    assert runs[0] == runs[-1] == "baseline"
    assert sorted(runs[1:-1]) == sorted(MODES)


@given(st.integers(min_value=1, max_value=50))
def test_each_mode_goes_first_in_half_of_an_even_number_of_rounds(pairs: int) -> None:
    first = Counter(designs(round_no)[1] for round_no in range(2 * pairs))
    assert first == {mode: pairs for mode in MODES}


@given(st.lists(st.integers(), min_size=1, max_size=8, unique=True), st.integers(min_value=0, max_value=100))
def test_turned_is_the_same_variants_in_a_turned_order(items: list[int], round_no: int) -> None:
    order = turned(items, round_no)
    assert sorted(order) == sorted(items)
    start = order.index(items[0])
    assert order[start:] + order[:start] == items  # a rotation: the variants keep their neighbours


@given(st.lists(st.integers(), min_size=1, max_size=8, unique=True), st.integers(min_value=1, max_value=5))
def test_each_variant_goes_first_equally_often_over_a_multiple_of_their_count(items: list[int], times: int) -> None:
    first = Counter(turned(items, round_no)[0] for round_no in range(times * len(items)))
    assert first == {item: times for item in items}
