"""The card reducer's loop keeps its state and totals in locals (perf, issue #43): it must reduce
every list of events exactly as the loop it replaced, which set a Reduced's fields as it went and is
kept here, verbatim, as the reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.card import NEXT, STATES, CardEvent, Reduced, ordering_key, reduce
from app.gateways.card import synced_totals


def reference(events: list[CardEvent]) -> Reduced:
    """app/core/card.py's reduce as of 8dbb454."""
    by_id = {}
    for e in events:
        by_id[e.id] = e
    unique = list(by_id.values())
    key = ordering_key(unique)
    pending = sorted(unique, key=key)
    out = Reduced()
    progressed = True
    while progressed and pending:
        progressed = False
        for ev in pending:
            if ev.kind == "synced" and ev.synced is not None:
                s = synced_totals(ev.synced)
                out.state = s.state if s.state in STATES else out.state
                out.authorised_minor = s.authorised_minor
                out.captured_minor = s.captured_minor
                out.refunded_minor = s.refunded_minor
                covered = [p for p in pending if key(p) < key(ev)]
                out.applied += [p.id for p in covered]
                pending = [p for p in pending if p not in covered]
            else:
                to = NEXT[out.state].get(ev.kind)
                over = ev.kind == "refunded" and out.refunded_minor + ev.amount_minor > out.captured_minor
                if to is None or over:
                    continue
                if ev.kind == "authorised":
                    out.authorised_minor = ev.amount_minor
                elif ev.kind == "captured":
                    out.captured_minor += ev.amount_minor
                elif ev.kind == "refunded":
                    out.refunded_minor += ev.amount_minor
                fully_refunded = out.refunded_minor > 0 and out.refunded_minor == out.captured_minor
                out.state = "refunded" if fully_refunded else to
            out.applied.append(ev.id)
            pending.remove(ev)
            progressed = True
            break
    out.parked = [p.id for p in pending]
    return out


KINDS = ["authorised", "captured", "refunded", "voided", "synced", "created"]


@st.composite
def card_events(draw: st.DrawFn) -> list[CardEvent]:
    """Payments of any shape: kinds in any order (unknown ones too), ids that repeat, sequences on
    all, some or none, clocks that tie, synced answers of any state and totals (and malformed none)."""
    sequenced = draw(st.sampled_from(["all", "none", "some"]))
    made = []
    for i in range(draw(st.integers(0, 7))):
        kind = draw(st.sampled_from(KINDS))
        synced = None
        if kind == "synced":
            synced = {"state": draw(st.sampled_from([*STATES, "odd"])),
                      "authorised_minor": draw(st.integers(0, 300)), "captured_minor": draw(st.integers(0, 300)),
                      "refunded_minor": draw(st.integers(0, 300))} if draw(st.booleans()) else None
        has_sequence = kind != "synced" and (sequenced == "all" or (sequenced == "some" and draw(st.booleans())))
        made.append(CardEvent(f"e{draw(st.integers(0, i))}", kind, draw(st.integers(0, 5)),
                              draw(st.sampled_from([0, 50, 100, 150, 200])),
                              draw(st.integers(0, 8)) if has_sequence else None, synced))
    return made


@settings(max_examples=400, deadline=None)
@given(card_events())
def test_the_reducer_reduces_as_the_loop_it_replaced(events: list[CardEvent]) -> None:
    assert reduce(events) == reference(events)


def test_the_reference_is_sensitive_to_what_the_reducer_decides() -> None:
    events = [CardEvent("a", "authorised", 1, 100), CardEvent("c", "captured", 2, 100),
              CardEvent("r", "refunded", 3, 150)]
    assert reduce(events) == reference(events) == Reduced("captured", 100, 100, 0, ["a", "c"], ["r"])
