"""The decision path's bytes do not change: every record plan_batch writes (decisions, effects,
facts, state snapshots, quarantine) and every state it stores, for seeded histories of the three
gateways, equal what the dict-state reducers of release 0.2 wrote (tests/unit/data/decide_golden.json.gz,
made by ``python -m tests.unit.test_decide_golden`` from that code and kept as it was), but for two
changes made on purpose: paymos's terminal rule follows its document (a newer snapshot of the same
terminal status waits for its reorg), which changed six paymos histories (2, 5, 41, 78, 88, 103) and
nothing else; and a decision's ``payload`` (and a parked paymos body), pg's stored ``data.object`` and
paymos's stored ``data`` are the body or its part as received, not orjson's writing of it again: once
a history has met a body not in orjson's form, its records and states must be the same JSON values,
no longer the same bytes.

The histories are `orderly simulate`'s (retries, outages, fetches, late correlations), with what
the fast path alone would not meet: bodies whose JSON is not in orjson's form (indented, escaped,
floats and unknown fields), records without the ingest's ``checked`` header, some of them refused
by the adapter, snapshots the schema takes and the core refuses, and batches decided again from their earlier state (a
crash before the offsets were committed).
"""

from __future__ import annotations

import base64
import gzip
import json
import random
import sys
from pathlib import Path
from typing import Any

import orjson

from app.core.dispatch import BatchPlan, Incoming, Record, plan_batch
from app.gateways.registry import GATEWAYS
from app.simulator import truths
from app.simulator.check import records as history_records
from topics.catalog import names
from topics.records import H_CHECKED

GOLDEN = Path(__file__).parent / "data" / "decide_golden.json.gz"
N = names("golden")
SEEDS = range(1, 201)


def odd_form(body: bytes, rng: random.Random) -> bytes:
    """The same JSON document spelled another way, with an unknown field (gateways add fields)."""
    doc = orjson.loads(body)
    doc["x_added"] = {"rate": rng.choice([1.5, 0.1, 1e-7, 2.0, 12345.678]), "note": "é \u2028 \"q\" /",
                      "n": [1, None, True]}
    return json.dumps(doc, indent=rng.choice([None, 1]), ensure_ascii=rng.random() < 0.5).encode()


def refused_form(body: bytes, rng: random.Random) -> bytes:
    """A body its adapter refuses (or the core does): a field of the wrong type or an odd value."""
    doc = orjson.loads(body)
    data = doc.get("data")
    obj = data.get("object") if isinstance(data, dict) else None
    target = obj if isinstance(obj, dict) else data if isinstance(data, dict) else doc
    field = rng.choice(sorted(target))
    target[field] = rng.choice(["", 1.25, -3, [], {"a": 1}, None, "x" * 5])
    return orjson.dumps(doc)


def broken_money(body: bytes) -> bytes:
    doc = orjson.loads(body)
    obj = doc["data"]["object"]
    if "credited_amount_minor" in obj:
        obj["credited_amount_minor"] += 1
    return orjson.dumps(doc)


def history_log(gateway: str, seed: int) -> list[Incoming]:
    rng = random.Random(seed * 7919)
    out = []
    for r in history_records(truths.make(gateway, seed, first_edition=True)):  # the inputs the file was made from
        value, headers, roll = r.value, list(r.headers), rng.random()
        if dict(headers).get("source") == b"webhook":
            if roll < 0.15:
                value = odd_form(value, rng)
            elif roll < 0.25:
                headers = [h for h in headers if h[0] != H_CHECKED]  # an older log: the worker checks it
            elif roll < 0.32:  # refused by the adapter: never checked (the ingest would have refused it)
                value = refused_form(value, rng)
                headers = [h for h in headers if h[0] != H_CHECKED]
            elif roll < 0.4 and b'"settled"' in value and gateway == "pg":
                value = broken_money(value)  # the schema takes it, the core's money rule does not
        out.append(Incoming(r.key, value, headers, r.offset, r.partition, N.raw))
    return out


def encoded(plan: BatchPlan) -> dict[str, Any]:
    def b(value: bytes) -> str:
        return base64.b64encode(value).decode()

    def record(r: Record) -> list[Any]:
        return [r[0], b(r[1]), b(r[2]), [[k, b(v)] for k, v in (r[3] if len(r) == 4 else [])]]

    # orderly.state's snapshots in key order: the planner takes them from a set (hash order varies
    # between processes), and the topic is compacted per key, so their order says nothing
    return {"records": {str(p): [record(r) for r in records if r[0] != N.state]
                        + sorted(record(r) for r in records if r[0] == N.state)
                        for p, records in sorted(plan.records.items())},
            "states": {b(k): b(v) for k, v in sorted(plan.states.items())},
            "set_aside": [list(s) for s in plan.set_aside]}


def in_orjsons_form(value: bytes) -> bool:
    try:
        return orjson.dumps(orjson.loads(value)) == value
    except orjson.JSONDecodeError:
        return True  # not JSON: set aside as it is, whatever the release


def run(gateway: str, seed: int) -> tuple[list[dict[str, Any]], list[bool]]:
    """Every batch's plan, in order (a batch is sometimes decided twice from the same stored state),
    and for each whether the history had met a body not in orjson's form by then."""
    rng = random.Random(seed)
    log, plans, start = history_log(gateway, seed), [], 0
    odd, met = [], False
    store: dict[bytes, bytes] = {}
    while start < len(log):
        size = rng.choice([1, 2, 3, 8, 64])
        batch = log[start:start + size]
        met = met or not all(in_orjsons_form(r.value) for r in batch)
        if rng.random() < 0.1:  # decided, state written, offsets not committed: decided again
            first = plan_batch(N, GATEWAYS, batch, lambda _p, key: store.get(key))
            plans.append(encoded(first))
            odd.append(met)
            store.update(first.states)
        plan = plan_batch(N, GATEWAYS, batch, lambda _p, key: store.get(key))
        plans.append(encoded(plan))
        odd.append(met)
        store.update(plan.states)
        start += size
    return plans, odd


def all_runs() -> dict[str, tuple[list[dict[str, Any]], list[bool]]]:
    return {f"{gateway}:{seed}": run(gateway, seed) for gateway in ("pg", "card", "paymos") for seed in SEEDS}


def as_values(plan: dict[str, Any]) -> dict[str, Any]:
    """A plan with what may carry a body or a part of it as received (decisions, stored states and
    orderly.state's snapshots) in a canonical JSON form (orjson's writing of their value, keys
    sorted: 1, 1.0 and true stay apart); every other record (effects, facts, quarantine) kept as its bytes."""
    def value(encoded_value: str) -> str:
        return orjson.dumps(orjson.loads(base64.b64decode(encoded_value)), option=orjson.OPT_SORT_KEYS).decode()

    def canonical(records: list[list[Any]]) -> list[list[Any]]:
        made = [[r[0], r[1], value(r[2]) if r[0] in (N.decisions, N.state) else r[2], r[3]] for r in records]
        # orderly.state's snapshots were sorted by their bytes (encoded): by their values here
        return [r for r in made if r[0] != N.state] + sorted(r for r in made if r[0] == N.state)

    return {"records": {p: canonical(records) for p, records in plan["records"].items()},
            "states": {k: value(v) for k, v in plan["states"].items()},
            "set_aside": plan["set_aside"]}


def test_every_record_and_state_is_the_bytes_the_dict_reducers_wrote() -> None:
    golden = orjson.loads(gzip.decompress(GOLDEN.read_bytes()))
    now = all_runs()
    assert sorted(now) == sorted(golden)
    as_bytes = as_json = 0
    for name, plans in golden.items():
        made, odd = now[name]
        assert len(made) == len(plans), name
        for number, (got, want, after_odd) in enumerate(zip(made, plans, odd, strict=True)):
            if after_odd:
                assert as_values(got) == as_values(want), f"{name}, batch {number}"
                as_json += got != want
            else:
                assert got == want, f"{name}, batch {number}"
                as_bytes += 1
    assert as_bytes > 500 and as_json > 100  # both kinds of batch are met, and the bodies' bytes show


def test_every_stored_state_of_the_dict_reducers_reads_and_writes_back_unchanged() -> None:
    """An existing deployment's changelog: each state the 0.2 reducers stored decodes into its
    gateway's typed state and encodes to the same bytes (and so does what orderly.state publishes)."""
    golden = orjson.loads(gzip.decompress(GOLDEN.read_bytes()))
    seen = 0
    for plans in golden.values():
        for plan in plans:
            snapshots: dict[bytes, set[bytes]] = {}  # several when the batch was decided record by record
            for records in plan["records"].values():
                for r in records:
                    if r[0] == N.state:
                        snapshots.setdefault(base64.b64decode(r[1]), set()).add(base64.b64decode(r[2]))
            for key, value in plan["states"].items():
                key_bytes, stored = base64.b64decode(key), base64.b64decode(value)
                reducer = GATEWAYS[key_bytes.partition(b":")[0].decode()].reducer
                state = reducer.load(stored)
                assert reducer.dump(state) == stored
                if key_bytes in snapshots:
                    assert reducer.snapshot(state) in snapshots[key_bytes]
                seen += 1
    assert seen > 1000


def test_the_histories_reach_every_path() -> None:
    """The golden data is worth something only if the histories meet what it is meant to pin."""
    golden = orjson.loads(gzip.decompress(GOLDEN.read_bytes()))
    outcomes: set[str] = set()
    set_aside = 0
    for plans in golden.values():
        for plan in plans:
            set_aside += len(plan["set_aside"])
            for records in plan["records"].values():
                for topic, _key, value, _headers in records:
                    if topic == N.decisions:
                        outcomes.add(orjson.loads(base64.b64decode(value))["outcome"])
    assert outcomes == {"applied", "stale", "duplicate", "parked", "unparked", "quarantined", "synced"}
    assert set_aside > 20


if __name__ == "__main__":  # writes the golden file: only from the code whose bytes are the reference
    GOLDEN.write_bytes(gzip.compress(orjson.dumps({name: plans for name, (plans, _) in all_runs().items()}), 9))
    print(f"{GOLDEN}: {GOLDEN.stat().st_size} bytes", file=sys.stderr)
