"""What a history must end at, from the lifecycle the simulator generated and the gateway documents
(pure). Written from gateway-docs/* and DESIGN.md §1-§2, not from app/core: nothing here imports
the core, and the order it reasons in is the lifecycle's true order (the position of each event in
it), never a key the core computes.

Each gateway's oracle is its simulator module's (app/simulator/<name>.py, ``oracle``); the rules:

- pg: a delivered event is applied iff its version is above every version delivered before it
  (the guard; a deposit's events are taken in log order once its correlation is there, and all
  wait while it is not); the read model holds the highest version delivered; the one-shot effects
  are the document's enqueueEffect calls for the applied snapshots (`deposit:{id}:credit_user` once,
  a debit only after a credit, late-slip / fail / review / status effects keyed on the event id,
  `withdrawal:{id}:close_payout` once); every fill's leg_ref and every overpayment claim is kept.
  Open gaps: the numbers above the first sequence seen and below the highest, never delivered,
  each first seen when the first delivery above it arrived.
- card: the payment is the truth of its captures and refunds: a fetched answer is the truth of
  every event created before it, and the events the gateway delivered after it apply on top in
  the playbook's way (in true order; an event that cannot apply yet waits). Effects are what
  that end state earned (`mark_order_paid` once captured, `mark_order_refunded` once fully
  refunded, `release_authorisation` once voided), plus what a state the deliveries showed on the
  way earned: a one-shot effect is not taken back (see ``card``; counted apart as ``transient``).
- paymos: the document's state machine in true order: a snapshot older than the current one is
  stale; a terminal state is left only by the reorg the document names for it (awaiting_payment out
  of a paid invoice, completion_rewound out of completed, reorged out of confirmed; a newer snapshot
  of the same terminal status is no exception), anything else waits for its reorg; `paid_late` is
  one note per invoice; one credit per invoice (paid or paid_over, whichever came first), a
  payout's completion per completion cycle.

Counted, not collected: the check counts each effect the core emits (one emitted twice is a mismatch,
``repeated``), and compares each delivery's outcomes in order (``outcomes``: applied, stale,
duplicate, parked then unparked or stale, synced) where the gateway's oracle states them (pg, card,
paymos). Effect keys follow one scheme, ``one_shot`` and ``per_snapshot`` below, from the documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # resource -> its read-model row's fields
    effects: set[tuple[str, str, Any]] = field(default_factory=set)  # (dedupe key, type, amount or None)
    facts: set[tuple[str, str]] = field(default_factory=set)  # (kind, key)
    parked: dict[str, int] = field(default_factory=dict)  # resource -> events still waiting
    gaps: set[tuple[int, int]] = field(default_factory=set)  # (missing sequence, first seen ms)
    transient: set[str] = field(default_factory=set)  # expected effects the end state did not earn
    broken: set[str] = field(default_factory=set)  # rows on the way that break a read model's CHECK
    repeated: set[str] = field(default_factory=set)  # effects emitted more than once (the core's, never the oracle's)
    # delivery (its index in the history) -> the outcomes decided for it, in order (``parked`` then
    # ``unparked``...); None in an oracle: not compared (a gateway whose oracle does not say them)
    outcomes: dict[int, list[str]] | None = None

    def differences(self, other: Outcome) -> list[str]:
        out = []
        if self.outcomes is not None:
            theirs = other.outcomes or {}
            out += [f"outcomes[delivery {i}]: expected {self.outcomes.get(i)}, core {theirs.get(i)}"
                    for i in sorted(set(self.outcomes) | set(theirs)) if self.outcomes.get(i) != theirs.get(i)]
        for name in ("rows", "effects", "facts", "parked", "gaps", "broken", "repeated"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                if isinstance(mine, set):
                    out.append(f"{name}: expected only {sorted(mine - theirs, key=str)}, "
                               f"core only {sorted(theirs - mine, key=str)}")
                else:
                    keys = sorted(set(mine) | set(theirs))
                    out += [f"{name}[{k}]: expected {mine.get(k)}, core {theirs.get(k)}"
                            for k in keys if mine.get(k) != theirs.get(k)]
        return out


# Effect keys (DESIGN §1: "every effect has a deterministic dedupe key (e.g. deposit:{id}:credit_user)").
# A one-shot business effect is bound to its resource: pg-event-order-version-guard.txt's
# enqueueEffect(t, `deposit:${o.id}`, ...) / `withdrawal:${o.id}`, "a resource-bound scope such as
# deposit:${o.id} for one-shot business effects", and docs/adding-a-gateway.md's `{kind}:{id}:{effect}`
# (card: `card:{payment_ref}`; paymos: `paymos:{resource id in data}`, the document's "dedupe business
# state on the resource id inside data"). An event-snapshot update is bound to the event ("may use
# event.id"). A one-shot effect that a lifecycle may earn again after a reorg (paymos's payout reopened
# by completion_rewound) is one per cycle: its scope ends with the cycle's number.
def one_shot(scope: str, resource: str, effect: str, cycle: int | None = None) -> str:
    return f"{scope}:{resource}:{effect}" + ("" if cycle is None else f":{cycle}")


def per_snapshot(event_id: str, effect: str) -> str:
    return f"{event_id}:{effect}"
