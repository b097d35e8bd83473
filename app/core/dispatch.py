"""From a record of orderly.raw to its decisions and output records, a batch at a time, with a
fault barrier per record (pure layer: no I/O, clock or Faust; the worker and replay share it).

A batch is decided in one pass over shared state objects, which is fast. If anything in that pass
raises (a reducer's bug on an odd body, a value orjson cannot write) or an output would not fit its
topic, the batch is decided again record by record, each record on a fresh copy of its resource's
last good state: a record that fails there is set aside to orderly.quarantine with the error and
leaves its resource's state exactly as it was (nothing half-applied), and the partition moves on.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import orjson

from app.core.incoming import SOUND, TAKEN, checked_as, delivery_of, read_headers
from app.core.incoming import Incoming as Incoming
from app.core.model import QUARANTINED, Decision, Delivery, Numbered, Recent, decide, redecided, remember
from app.core.reducer import Gateways, Reducer
from app.gateways.base import Route
from app.gateways.limits import body_error, may_nest_deeper, unreadable
from topics.catalog import DERIVED_RECORD_BYTES, TopicNames
from topics.records import CORRELATION, H_CHECKED, H_RECORD, quarantine_headers

Record = tuple[str, bytes, bytes] | tuple[str, bytes, bytes, list[tuple[str, bytes]]]
# A resource's state (with its parked events) and every output record stay within half of what
# their topics accept (DERIVED_RECORD_BYTES by default; the worker passes its topics' real limit):
# a record that would take them past it is set aside. Half: headroom for a batch's framing, and a
# record's JSON may grow when written inside another (a parked body as a string escapes its quotes).
REASON_MAX = 500
STAGE = "worker"


class Refused(ValueError):
    """A raw record its gateway's adapter refuses: it is set aside with the adapter's reason."""


class Oversize(ValueError):
    """An output record or a resource's state would not fit its topic."""


@dataclass
class BatchPlan:
    """What deciding a batch produced: the records to send per source partition, each touched
    resource's new state, and counts for the metrics."""

    records: dict[int, list[Record]] = field(default_factory=dict)
    states: dict[bytes, bytes] = field(default_factory=dict)  # resource key -> serialised state
    last: dict[bytes, int] = field(default_factory=dict)  # resource key -> index of its last record
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    effects: Counter[tuple[str, str]] = field(default_factory=Counter)
    errors: list[Decision] = field(default_factory=list)  # decisions carrying an error, for the log
    set_aside: list[tuple[str, str]] = field(default_factory=list)  # (gateway, reason)


NEST_MAX = 250  # the depth a body carried as its bytes may reach (orjson writes 254 levels at most)
_NEST_BYTES = 2 * NEST_MAX  # a body nested past NEST_MAX opens and closes that many brackets at least
_FIRST = itemgetter(0)  # a recent delivery's id
TOUCHING = frozenset({"parked", "applied", "unparked"})  # outcomes that change what orderly.state shows


def touches_state(decisions: list[Decision]) -> bool:
    """Whether these decisions change what orderly.state publishes for the resource."""
    return any(d.row is not None or d.outcome in TOUCHING for d in decisions)


def reducer_of(gateways: Gateways, key: bytes) -> Reducer[Any, Any] | None:
    """The reducer whose state is stored under ``key`` (``gateway:resource_id``)."""
    found = gateways.get(key.partition(b":")[0].decode(errors="replace"))
    return found.reducer if found is not None else None


def state_record(n: TopicNames, key: bytes, reducer: Reducer[Any, Any], state: object) -> Record:
    """The resource's orderly.state snapshot (compacted: the latest per resource is what stays)."""
    return n.state, key, reducer.snapshot(state)


def output_records(decision: Decision, n: TopicNames) -> list[Record]:
    """A decision's records: itself, its effects and its facts (the fast pass writes the same inline)."""
    key = f"{decision.gateway}:{decision.resource_id}".encode()
    records: list[Record] = [(n.decisions, key, decision.to_bytes())]
    for effect in decision.effects:
        records.append((n.effects, effect.dedupe_key.encode(), effect.to_bytes()))
    for fact in decision.facts:
        records.append((n.facts, fact.key.encode(), orjson.dumps(
            {"kind": fact.kind, "key": fact.key, "gateway": decision.gateway,
             "resource_id": decision.resource_id, "data": fact.data})))
    return records


def decide_record(topic: str, gateways: Gateways, state: Any, key: bytes, value: bytes,
                  headers: dict[str, str], offset: int, partition: int) -> tuple[Any, list[Decision]]:
    """Decide one record on its resource's ``state`` (the state object of the key's gateway, or None)."""
    delivery = delivery_of(key.decode(), headers, topic, offset, partition)
    return decide_delivery(gateways, state, value, delivery, headers.get(H_RECORD) == CORRELATION,
                           checked_as(headers.get(H_CHECKED)))


def decide_delivery(gateways: Gateways, state: Any, value: bytes, delivery: Delivery, correlation: bool,
                    checked: int) -> tuple[Any, list[Decision]]:
    """:func:`decide_record` once its headers are read: ``correlation``, whether the record is the
    merchant's correlation; ``checked``, how the ingest checked it (``incoming.checked_as``)."""
    # the recent deliveries' ids compared in C first: a delivery decided before is rare
    if state is not None and delivery.delivery_id in map(_FIRST, state.recent):
        again = redecided(state, delivery)
        if again is not None:  # decided before, but its offsets were not committed: the same outcome again
            return state, again
    gateway = delivery.gateway
    before: Recent = state.recent if state is not None else []
    found = gateways.get(gateway)
    after: Numbered
    if correlation:  # the merchant's mapping of a resource (a pg deposit)
        if found is None or found.reducer.correlate is None:
            return state, [decide(delivery, QUARANTINED, error=f"gateway {gateway!r} takes no correlation")]
        after, decisions = found.reducer.correlate(state, value, delivery)
    elif found is not None:
        # The body is read once, here, into the gateway's typed event. A record the ingest checked
        # (SOUND) is read by the schema alone. One a source other than the ingest appended (the
        # fetcher's, a redrive) gets the ingest's checks of the body as a whole first; one an earlier
        # ingest checked (TAKEN), the check it did not make; one nobody checked (an older log, a direct
        # append), its adapter's checks in full (``trusted`` False). So no state holds what DESIGN.md
        # §2.4 refuses, and the bytes decisions and parked events carry read back everywhere. A body
        # that may nest past NEST_MAX (told by its length first) is checked again in any case.
        trusted = True
        if checked == SOUND:
            problem = body_error(value) if len(value) > _NEST_BYTES and may_nest_deeper(value, NEST_MAX) else None
        elif checked == TAKEN:
            problem = unreadable(value) or (body_error(value) if may_nest_deeper(value, NEST_MAX) else None)
        elif delivery.source != "webhook":
            problem = body_error(value) or unreadable(value)
        else:
            problem, trusted = None, False
        if problem is not None:
            raise Refused(problem)
        event = found.reducer.read(value, trusted)
        if isinstance(event, Route):
            raise Refused(event.quarantine_reason or "refused by its adapter")
        after, decisions = found.reducer.apply_event(state, event, delivery)
    else:
        return state, [decide(delivery, QUARANTINED, error=f"no reducer for gateway {gateway!r}")]
    remember(before, after, delivery, decisions)
    return after, decisions


def _count(plan: BatchPlan, decisions: list[Decision]) -> None:
    for decision in decisions:
        plan.outcomes[(decision.gateway, decision.outcome)] += 1
        for effect in decision.effects:
            plan.effects[(decision.gateway, effect.type)] += 1
        if decision.error:
            plan.errors.append(decision)


def _check_size(records: list[Record], state: bytes | None, max_bytes: int) -> None:
    for record in records:
        if len(record[2]) > max_bytes:
            raise Oversize(f"an output record for {record[0]} would be {len(record[2])} bytes (at most {max_bytes})")
    if state is not None and len(state) > max_bytes:
        raise Oversize(f"the resource's state would be {len(state)} bytes (at most {max_bytes}): "
                       "too many or too large parked or stored events")


def plan_batch(n: TopicNames, gateways: Gateways, batch: list[Incoming],
               read: Callable[[int, bytes], bytes | None], topic_max_bytes: int = DERIVED_RECORD_BYTES) -> BatchPlan:
    """Decide ``batch`` (in log order) with the reducers of ``gateways`` (the registry's table);
    ``read(partition, key)`` gives a resource's stored state; ``topic_max_bytes`` is the largest
    record the output topics take. Never raises for what a record holds: see the module's docstring."""
    max_bytes = topic_max_bytes // 2
    try:
        return _plan_fast(n, gateways, batch, read, max_bytes)
    except Exception:  # whatever it was, the careful pass finds the record and sets it aside with the reason
        return _plan_careful(n, gateways, batch, read, max_bytes)


def _load(reducer: Reducer[Any, Any] | None, stored: bytes | None) -> Any:
    return reducer.load(stored) if stored is not None and reducer is not None else None


def _plan_fast(n: TopicNames, gateways: Gateways, batch: list[Incoming],
               read: Callable[[int, bytes], bytes | None], max_bytes: int) -> BatchPlan:
    # The hot loop: locals bound once, counters inline; states stay objects, each written once after it.
    plan = BatchPlan()
    overlay: dict[bytes, Any] = {}
    reducers: dict[bytes, Reducer[Any, Any] | None] = {}
    changed: set[bytes] = set()
    last, records, errors = plan.last, plan.records, plan.errors
    # Counted in plain dicts, into the plan's Counters once at the end: a Counter defines __delitem__
    # in Python, so each item set on one goes through a Python-level slot (about 2 k instructions).
    outcomes: dict[tuple[str, str], int] = {}
    effect_counts: dict[tuple[str, str], int] = {}
    decisions_topic, dumps = n.decisions, orjson.dumps
    for index, record in enumerate(batch):
        key, partition = record.key, record.partition
        if key in overlay:
            state = overlay[key]
        else:
            reducer = reducers[key] = reducer_of(gateways, key)
            state = _load(reducer, read(partition, key))
        delivery, correlation, checked = read_headers(record)
        state, decisions = decide_delivery(gateways, state, record.value, delivery, correlation, checked)
        overlay[key] = state
        last[key] = index
        outputs = records.get(partition)
        if outputs is None:
            outputs = records[partition] = []
        # output_records inline; a decision is about the record's own resource, so its key is the record's
        for decision in decisions:
            gateway, outcome = decision.gateway, decision.outcome
            if decision.effects or decision.facts:
                outputs += _written_once(decision, key, n)
                for effect in decision.effects:
                    counted = (gateway, effect.type)
                    effect_counts[counted] = effect_counts.get(counted, 0) + 1
            else:
                outputs.append((decisions_topic, key, dumps(decision)))
            counted = (gateway, outcome)
            outcomes[counted] = outcomes.get(counted, 0) + 1
            if outcome in TOUCHING or decision.row is not None:
                changed.add(key)
            if decision.error:
                errors.append(decision)
    plan.outcomes.update(outcomes)
    plan.effects.update(effect_counts)
    plan.states = {key: reducers[key].dump(state)  # type: ignore[union-attr]  # a state has its reducer
                   for key, state in overlay.items() if state is not None}
    # orderly.state is compacted: one snapshot per resource per batch is all it keeps anyway
    for key in changed:
        if (state := overlay[key]) is not None:
            records[batch[last[key]].partition].append((n.state, key, reducers[key].snapshot(state)))  # type: ignore[union-attr]
    # Sizes after the loop, not inside it; the careful pass finds which record it was and sets it
    # aside. Compared one by one: max() over an itemgetter map costs more per record in 3.11.
    if max(map(len, plan.states.values()), default=0) > max_bytes:
        raise Oversize(f"a resource's state would be over {max_bytes} bytes")
    for outputs in records.values():
        for output in outputs:
            if len(output[2]) > max_bytes:
                raise Oversize(f"a record for {output[0]} would be {len(output[2])} bytes (at most {max_bytes})")
    return plan


def _written_once(decision: Decision, key: bytes, n: TopicNames) -> list[Record]:
    """The records of a decision with effects or facts, as :func:`output_records` writes them, with
    each effect and each fact's data written once: the decision carries those same bytes (orjson
    copies a Fragment as it is), where writing it whole would write them a second time."""
    dumps, gateway, resource_id = orjson.dumps, decision.gateway, decision.resource_id
    records: list[Record] = [(n.decisions, key, b"")]  # its place: the decision's own record first
    effects, facts = [], []
    for effect in decision.effects:
        written = dumps(effect)
        effects.append(orjson.Fragment(written))
        records.append((n.effects, effect.dedupe_key.encode(), written))
    for fact in decision.facts:
        data = orjson.Fragment(dumps(fact.data))
        facts.append({"kind": fact.kind, "key": fact.key, "data": data})  # a Fact's fields, in order
        records.append((n.facts, fact.key.encode(), dumps(
            {"kind": fact.kind, "key": fact.key, "gateway": gateway, "resource_id": resource_id, "data": data})))
    # orjson writes a dataclass from its __dict__, in field order: a copy of it writes the same object
    fields = vars(decision).copy()
    fields["effects"], fields["facts"] = effects, facts
    records[0] = (n.decisions, key, dumps(fields))
    return records


def _plan_careful(n: TopicNames, gateways: Gateways, batch: list[Incoming],
                  read: Callable[[int, bytes], bytes | None], max_bytes: int) -> BatchPlan:
    plan = BatchPlan()
    current: dict[bytes, bytes | None] = {}  # resource key -> its last good state
    for index, record in enumerate(batch):
        key = record.key
        if key not in current:  # a record appended without a key has no resource, and no state
            current[key] = read(record.partition, key) if key is not None else None
        before = current[key]
        headers = {k: (v or b"").decode(errors="replace") for k, v in record.headers}  # a value may be null
        outputs = plan.records.setdefault(record.partition, [])
        try:
            if key is None:
                raise Refused("the record has no key: it names no resource (gateway:resource_id)")
            reducer = reducer_of(gateways, key)
            state, decisions = decide_record(record.topic, gateways, _load(reducer, before),
                                             key, record.value, headers, record.offset, record.partition)
            after = None
            made = [r for d in decisions for r in output_records(d, n)]
            if state is not None and reducer is not None:
                after = reducer.dump(state)
                if touches_state(decisions):
                    made.append(state_record(n, key, reducer, state))
            _check_size(made, after, max_bytes)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"[:REASON_MAX]
            outputs += set_aside(n, record, headers, before, reason)
            named = headers.get("gateway") or (key or b"").decode(errors="replace").partition(":")[0]
            plan.set_aside.append((named, reason))
            plan.outcomes[(plan.set_aside[-1][0], QUARANTINED)] += 1
            continue
        current[key] = after
        plan.last[key] = index
        outputs += made
        _count(plan, decisions)
    plan.states = {key: state for key, state in current.items() if state is not None and key in plan.last}
    return plan


def set_aside(n: TopicNames, record: Incoming, headers: dict[str, str], state: bytes | None,
              reason: str) -> list[Record]:
    """The record to orderly.quarantine (its body and headers, with the stage and the reason), and a
    `quarantined` decision for the resource's timeline; the resource's state does not change."""
    resource_key = (record.key or b"").decode(errors="replace")  # a record appended without a key too
    delivery = delivery_of(resource_key, headers, record.topic, record.offset, record.partition, strict=False)
    ordinal = _last_ordinal(state) + 1
    decision = decide(delivery, QUARANTINED, error=f"set aside by the {STAGE}: {reason}")
    decision.seq = ordinal  # not kept in the state: the state does not change
    return [
        (n.quarantine, delivery.delivery_id.encode(), record.value,
         quarantine_headers(record.headers, STAGE, reason, resource_key)),
        (n.decisions, record.key or b"", decision.to_bytes()),
    ]


def _last_ordinal(state: bytes | None) -> int:
    """The ordinal a stored state reached; 0 where it has none or is damaged (setting aside never fails)."""
    try:
        found = orjson.loads(state) if state is not None else None
    except orjson.JSONDecodeError:
        return 0
    ordinal = found.get("n", 0) if isinstance(found, dict) else 0
    return ordinal if type(ordinal) is int and 0 <= ordinal < 1 << 62 else 0
