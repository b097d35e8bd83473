"""The card reducer once a synced answer (the GET answer, without a sequence) is stored among
sequenced events: the sequence still orders the events, the answer sits after what it covers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.card import CardEvent, Reduced, parse_time_ms, reduce
from app.gateways.card import Synced

T0 = parse_time_ms("2026-11-30T00:55:12.490Z")


def ev(eid: str, kind: str, at: int, amount: int, sequence: int) -> CardEvent:
    return CardEvent(eid, kind, T0 + at, amount, sequence)


def answer(at: int, state: str, authorised: int, captured: int, refunded: int) -> CardEvent:
    return CardEvent(f"sync_{state}_{authorised}_{captured}_{refunded}", "synced", T0 + at,
                     synced=Synced(state, authorised, captured, refunded))


def totals(r: Reduced) -> tuple[str, int, int, int]:
    return r.state, r.authorised_minor, r.captured_minor, r.refunded_minor


def test_seed_2917_a_refund_stamped_before_the_capture_it_follows_stays_after_it_past_a_fetch() -> None:
    """`orderly simulate --check --gateway card` seed 2917: fetched once (captured 108), then a capture
    of 6581 (sequence 3) and a refund of 108 (sequence 4) stamped 5 s before it. Ordered by clock the
    refund refunds the payment in full and parks the capture; by sequence it comes last."""
    events = [ev("e0", "authorised", 0, 6689, 1), ev("e1", "captured", 0, 108, 2),
              answer(2_819_000, "captured", 6689, 108, 0),
              ev("e2", "captured", 3_600_000, 6581, 3), ev("e3", "refunded", 3_595_000, 108, 4)]
    r = reduce(events)
    assert totals(r) == ("captured", 6689, 6689, 108)
    assert r.parked == []


def test_an_answer_behind_a_gap_does_not_cover_an_event_stamped_after_the_fetch() -> None:
    """Seed 4516's shape: only sequence 3 (a capture of 222) is stored; the answer says captured 10613.
    The totals hold either reading (sequence 2 captured 10391 or 10613), so the fetch's moment decides."""
    fetched = answer(0, "captured", 10835, 10613, 0)
    assert totals(reduce([fetched, ev("e2", "captured", 381, 222, 3)])) == ("captured", 10835, 10835, 0)
    assert totals(reduce([fetched, ev("e2", "captured", -381, 222, 3)])) == ("captured", 10835, 10613, 0)


def test_without_a_gap_the_totals_decide_whatever_the_clocks_say() -> None:
    events = [ev("e0", "authorised", 0, 500, 1), ev("e1", "captured", 9_000, 200, 2)]
    # stamped after the fetch, the capture is still in the answer's totals: covered, not counted twice
    assert totals(reduce([*events, answer(1_000, "captured", 500, 200, 0)])) == ("captured", 500, 200, 0)
    # stamped before the fetch, an answer without it leaves it on top
    assert totals(reduce([*events, answer(10_000, "authorised", 500, 0, 0)])) == ("captured", 500, 200, 0)


def test_answers_placed_alike_apply_in_the_order_they_were_fetched() -> None:
    """Seed 3579's shape: two answers over the same stored events; the later one is the newer state
    (the ids sort the other way)."""
    events = [ev("e0", "authorised", 0, 54043, 1), answer(1_000, "captured", 54043, 2902, 428),
              answer(2_000, "captured", 54043, 2902, 1258)]
    assert totals(reduce(events)) == ("captured", 54043, 2902, 1258)


@st.composite
def lifecycles(draw: st.DrawFn) -> list[tuple[str, int]]:
    """A payment's events in the gateway's order: an authorisation, captures and partial refunds."""
    auth = draw(st.integers(1, 10_000))
    steps, captured, refunded = [("authorised", auth)], 0, 0
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["captured", "refunded"] if captured > refunded else ["captured"]))
        if kind == "captured" and captured < auth:
            amount = draw(st.integers(1, auth - captured))
            captured += amount
        elif kind == "refunded":
            amount = draw(st.integers(1, captured - refunded))
            refunded += amount
        else:
            continue
        steps.append((kind, amount))
        if refunded == captured > 0:
            break  # refunded in full: the playbook's last state
    return steps


def truth(steps: list[tuple[str, int]]) -> tuple[str, int, int, int]:
    captured = sum(a for k, a in steps if k == "captured")
    refunded = sum(a for k, a in steps if k == "refunded")
    state = "refunded" if refunded and refunded == captured else steps[-1][0] if steps[-1][0] != "refunded" \
        else "captured"
    return state, steps[0][1], captured, refunded


@settings(max_examples=300, deadline=None)
@given(lifecycles(), st.data())
def test_every_event_stored_the_sequence_decides_wherever_the_clocks_and_the_answer_sit(
        steps: list[tuple[str, int]], data: st.DataObject) -> None:
    stamps = data.draw(st.lists(st.integers(0, 10_000), min_size=len(steps), max_size=len(steps)))
    events = [ev(f"e{n}", kind, stamps[n], amount, n + 1) for n, (kind, amount) in enumerate(steps)]
    cut = data.draw(st.integers(1, len(steps)))  # the answer is the gateway's state after `cut` events
    fetched = answer(data.draw(st.integers(0, 10_000)), *truth(steps[:cut]))
    order = data.draw(st.permutations([*events, fetched]))
    r = reduce(order)
    assert totals(r) == truth(steps)
    assert r.parked == []
