"""`orderly simulate --check`: seeded histories through the pure core, compared with the oracle.

The core is driven as the worker drives it (app/core/dispatch.py): each delivery becomes a record
of orderly.raw with the headers the ingest, the fetcher or the correlation endpoint give it, the
records are decided by ``plan_batch`` in batches of random size, and a dict stands for the worker's
table (each resource's serialised state between batches). From the records the plan sends, the
run keeps what the read models and the merchant would see: each resource's last row, the effects
(dedupe key, type, amount), the facts, the parked count in the final state, the open pg gaps
the projector would fold from the decisions (app/core/gaps.py), and any row on the way that its
table's CHECKs would refuse (card_payments'). What is compared per gateway, its generator and its
oracle are the gateway's simulator declaration (app/simulator/plugins.py); nothing here names one.

History ``i`` of ``--seed S`` is the history of seed ``S + i``, so a mismatch printed with its seed
is reproduced alone by ``--seed <that seed> --histories 1``. A mismatching history is shrunk
(deliveries dropped one at a time while the mismatch persists) before it is printed.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TextIO

import orjson

from app.core import gaps as gap_rules
from app.core.dispatch import Incoming, plan_batch
from app.gateways.registry import GATEWAYS
from app.simulator import truths
from app.simulator.histories import History
from app.simulator.oracle import Outcome
from app.simulator.plugins import simulator_of
from topics.catalog import names
from topics.records import CHECKED, correlation_headers, raw_headers

TOPICS = names("simcheck")
MONEY_EFFECTS = {"credit_user", "debit_user"}


def records(history: History) -> list[Incoming]:
    """The history as records of orderly.raw, in log order."""
    out = []
    for offset, d in enumerate(history.deliveries):
        if d.source == "correlation":
            headers = correlation_headers(history.gateway, f"corr-{offset}", d.at_ms)
        else:
            headers = raw_headers(history.gateway, f"dlv-{offset}", d.at_ms, source=d.source)
            if d.source == "webhook":
                headers.append(CHECKED)  # the ingest validated it (tests check that it would)
        out.append(Incoming(f"{history.gateway}:{d.resource}".encode(), d.body, headers, offset, 0, TOPICS.raw))
    return out


def observed(history: History, batch_sizes: random.Random) -> Outcome:
    """What the core decides for ``history``, as the read models and the merchant would see it."""
    store: dict[bytes, bytes] = {}
    got = Outcome()
    sim = simulator_of(history.gateway)
    batch = records(history)
    sequences: list[tuple[int, int]] = []
    emitted: Counter[str] = Counter()
    outcomes: dict[int, list[str]] = {}
    start = 0
    while start < len(batch):
        size = batch_sizes.choice([1, 2, 3, 8, 64])
        plan = plan_batch(TOPICS, GATEWAYS, batch[start:start + size], lambda _p, key: store.get(key))
        start += size
        store.update(plan.states)
        for topic, _key, value in (r[:3] for outputs in plan.records.values() for r in outputs):
            if topic != TOPICS.decisions:
                continue
            decision = orjson.loads(value)
            delivery = int(decision["delivery_id"].rpartition("-")[2])  # dlv-<offset> | corr-<offset>
            outcomes.setdefault(delivery, []).append(decision["outcome"])
            if decision["outcome"] != "quarantined" and decision["sequence"] is not None:
                sequences.append((decision["sequence"], decision["received_at_ms"]))
            if decision.get("error") and decision["outcome"] == "quarantined":
                got.facts.add(("quarantined", f"{decision['event_id']}: {decision['error']}"))
            row, table = decision["row"], decision["table"]
            if row is not None and table in sim.row_breaks:
                got.broken |= sim.row_breaks[table](row)
            if row is not None and table in sim.rows:
                got.rows[decision["resource_id"]] = {k: row.get(k) for k in sim.rows[table]}
            for effect in decision["effects"]:
                amount = effect["payload"].get("amount_minor") if effect["type"] in MONEY_EFFECTS else None
                got.effects.add((effect["dedupe_key"], effect["type"], amount))
                emitted[effect["dedupe_key"]] += 1  # a multiset: one effect emitted twice is a mismatch
            got.facts |= {(f["kind"], f["key"]) for f in decision["facts"] if f["kind"] in sim.facts}
    got.repeated = {f"{key} emitted {n} times" for key, n in emitted.items() if n > 1}
    got.outcomes = outcomes
    gateway = GATEWAYS[history.gateway]
    reducer = gateway.reducer
    for key, state in store.items():
        # (a gateway that never parks may not say so)
        parked = orjson.loads(reducer.snapshot(reducer.load(state))).get("parked", 0)
        if parked:
            got.parked[key.decode().partition(":")[2]] = parked
    if gateway.fetch is not None and gateway.fetch.backfill is not None:  # its sequence's gaps, as projected
        max_seen: int | None = None
        open_gaps: list[gap_rules.Gap] = []
        for seq, at in sequences:
            max_seen, open_gaps = gap_rules.observe(max_seen, open_gaps, seq, at)
        got.gaps = {(s, g.first_seen_ms) for g in open_gaps for s in range(g.start, g.end + 1)}
    return got


def expected(history: History) -> Outcome:
    want = simulator_of(history.gateway).oracle(history)
    want.parked = {k: v for k, v in want.parked.items() if v}
    return want


def mismatch(history: History) -> list[str]:
    return expected(history).differences(observed(history, random.Random(history.seed)))


def shrink(history: History, still: Callable[[History], bool]) -> History:
    """Drop deliveries one at a time while ``still`` holds, until no single drop keeps it."""
    smaller = True
    while smaller:
        smaller = False
        for i in range(len(history.deliveries)):
            candidate = replace(history, deliveries=history.deliveries[:i] + history.deliveries[i + 1:])
            if still(candidate):
                history, smaller = candidate, True
                break
    return history


@dataclass
class Report:
    gateway: str
    histories: int = 0
    deliveries: int = 0
    mismatches: list[tuple[History, History, list[str]]] = field(default_factory=list)  # (original, shrunk, why)
    transient: int = 0  # histories with an effect earned only by a state shown on the way (card's oracle)
    seconds: float = 0.0


def check_gateway(gateway: str, count: int, seed: int, keep: int = 3) -> Report:
    """``count`` histories of ``gateway`` from ``seed`` on; the first ``keep`` mismatches are shrunk."""
    report, started = Report(gateway), time.perf_counter()
    for i in range(count):
        history = truths.make(gateway, seed + i)
        report.histories += 1
        report.deliveries += len(history.deliveries)
        want = expected(history)
        report.transient += bool(want.transient)
        why = want.differences(observed(history, random.Random(history.seed)))
        if why:
            small = shrink(history, lambda h: bool(mismatch(h))) if len(report.mismatches) < keep else history
            report.mismatches.append((history, small, mismatch(small)))
    report.seconds = time.perf_counter() - started
    return report


def print_report(report: Report, out: TextIO, keep: int = 3) -> None:
    print(f"{report.gateway}: {report.histories} histories, {report.deliveries} deliveries, "
          f"{len(report.mismatches)} mismatches in {report.seconds:.1f} s"
          + (f"; {report.transient} with a one-shot effect only a passing state earned" if report.transient else ""),
          file=out)
    for original, small, why in report.mismatches[:keep]:
        print(f"  MISMATCH {report.gateway} seed={original.seed} ({len(original.deliveries)} deliveries, "
              f"shrunk to {len(small.deliveries)}); reproduce: orderly simulate --check --gateway "
              f"{report.gateway} --seed {original.seed} --histories 1", file=out)
        for line in why:
            print(f"    {line}", file=out)
        for d in small.deliveries:
            print(f"    {d.describe()}", file=out)
    if len(report.mismatches) > keep:
        seeds = ", ".join(str(h.seed) for h, _, _ in report.mismatches[keep:keep + 20])
        print(f"  more mismatching seeds: {seeds}", file=out)


def run(gateways: list[str], count: int, seed: int, out: TextIO) -> tuple[int, int]:
    """The command: every gateway's histories; prints per gateway and the last line; (histories, mismatches)."""
    total = bad = 0
    for gateway in gateways:
        report = check_gateway(gateway, count, seed)
        print_report(report, out)
        total, bad = total + report.histories, bad + len(report.mismatches)
    print(f"check: histories={total} mismatches={bad}", file=out)
    return total, bad

