"""The floor: Orderly's shape on its stack with none of Orderly's logic, side by side with Orderly's
builds at-least-once on the same signed webhooks (`python -m bench floor`).

The floor keeps the steps of the shape, each with the library Orderly uses and in the cheapest way
this project found for it:

- **ingest** (uvloop, an ``asyncio.Protocol``): a keep-alive HTTP/1.1 request split at its
  Content-Length, the pg signature checked (HMAC-SHA256, its timestamp's tolerance), the body read
  once for its resource id and appended to the raw topic with the raw headers (aiokafka, acks=all,
  idempotent, the key's murmur2 partition), 200 once Kafka acknowledged it. No other checks, limits,
  metrics or logs.
- **worker** (aiokafka, no Faust): a consumer of every raw partition; per record the body read and
  its version compared with the resource's last (a dict in memory, no local store); a decision record
  carrying the body, the pg reducer's effects, per resource and batch a state and a changelog record
  (a version and a status, not a reducer's state), all sent as one aiokafka batch per
  topic-partition and acknowledged before the offsets are committed.
- **projector** (aiokafka, asyncpg): a consumer of the decisions and effects; per batch one
  transaction with Orderly's own statements and tables: the webhook_events rows (body as jsonb), the
  pg_deposits upsert with its version guard, the ledger entries, the effects outbox rows (Orderly's
  effects process, folded in) and the consumed offsets.

No dedupe, parking, correlations, gaps, body checks, exactly-once, quarantine, metrics, readiness
or recovery; no write ordering between outputs and state, smaller records. A measured skeleton
shows what the shape costs at most, not what every build must cost: Orderly's excess over it, per
process, is its logic and everything else the floor leaves out.
"""

from __future__ import annotations

import asyncio
import hmac
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from hashlib import sha256
from pathlib import Path
from typing import Any

import msgspec
import orjson

from app.ingest.deliveries import next_delivery_id
from app.kafka_client import client_options
from topics.partitioning import partition_for
from topics.records import CHECKED, raw_headers

ROUNDS = os.environ.get("BENCH_ROUNDS")  # default: each design first twice
FLOOR_PROCESSES = ("worker", "projector")
CONSUMER = "floor"
SINK_RECORDS = 2000  # a batch of Orderly's sinks at most (app/sink.py)


# --- ingest -------------------------------------------------------------------------------------------

OK = b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s'
REFUSED = {400: b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
           401: b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n",
           503: b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"}
TOLERANCE_S = 300  # the pg signature's timestamp tolerance


class Appends:
    """Each request's append handed to aiokafka on its own (its producer adds it to the partition's open
    batch until the request in flight returns, as the ingest's does), the request answered once Kafka
    acknowledged it. Measured here: batches of each turn of the loop's appends (app/producer.py's way)
    cost the floor's ingest a quarter more CPU, a batch of two or three records per partition each."""

    def __init__(self, producer: Any, topic: str, partitions: int) -> None:
        self.producer, self.topic, self.partitions = producer, topic, partitions
        self.sending: set[asyncio.Task[None]] = set()
        self.failed = False

    def add(self, key: bytes, value: bytes, delivery_id: str, transport: Any) -> None:
        # the ingest's headers, its CHECKED mark too (the floor's worker reads none but the id): the same bytes
        headers = [*raw_headers("pg", delivery_id, int(time.time() * 1000)), CHECKED]
        task = asyncio.get_running_loop().create_task(self.send(key, value, headers, delivery_id, transport))
        self.sending.add(task)
        task.add_done_callback(self.sending.discard)

    async def send(self, key: bytes, value: bytes, headers: list[tuple[str, bytes]], delivery_id: str,
                   transport: Any) -> None:
        try:
            await (await self.producer.send(self.topic, value, key=key, headers=headers,
                                            partition=partition_for(key, self.partitions)))
        except Exception as exc:
            if not self.failed:  # once: a broken run says why in the floor's log
                self.failed = True
                print(f"floor ingest: append failed: {exc!r}", file=sys.stderr, flush=True)
            transport.write(REFUSED[503])
            return
        answer = orjson.dumps({"status": "stored", "delivery_id": delivery_id})  # the ingest's answer
        transport.write(OK % (len(answer), answer))


class Ingest(asyncio.Protocol):
    """A keep-alive connection: each request split at its Content-Length, its signature checked, its
    body appended under its resource's key with the raw topic's headers."""

    def __init__(self, secret: bytes, appends: Appends) -> None:
        self.secret, self.appends = secret, appends
        self.buf = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while (head_end := self.buf.find(b"\r\n\r\n")) >= 0:
            length, signature = 0, b""
            for line in self.buf[:head_end].split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"pg-signature":
                    signature = value.strip()
            end = head_end + 4 + length
            if len(self.buf) < end:
                return
            body, self.buf = self.buf[head_end + 4:end], self.buf[end:]
            self.take(body, signature)

    def take(self, body: bytes, signature: bytes) -> None:
        stamp, _, offered = signature.partition(b",v1=")
        expected = hmac.new(self.secret, stamp[2:] + b"." + body, sha256).hexdigest().encode()
        fresh = stamp[2:].isdigit() and abs(time.time() - int(stamp[2:])) <= TOLERANCE_S
        if not hmac.compare_digest(expected, offered) or not fresh:
            self.transport.write(REFUSED[401])
            return
        try:
            key = b"pg:" + orjson.loads(body)["data"]["object"]["id"].encode()
        except (ValueError, KeyError, TypeError, AttributeError):
            self.transport.write(REFUSED[400])
            return
        self.appends.add(key, body, next_delivery_id(), self.transport)


async def run_ingest(port: int) -> None:
    from aiokafka import AIOKafkaProducer

    settings, n = _settings()
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all", enable_idempotence=True,
                                linger_ms=0, max_batch_size=256 * 1024, **client_options(settings))
    await producer.start()
    appends = Appends(producer, n.raw, len(await producer.partitions_for(n.raw)))
    secret = settings.secrets["pg"].reveal()[0].encode()
    server = await asyncio.get_running_loop().create_server(lambda: Ingest(secret, appends), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


# --- worker -------------------------------------------------------------------------------------------

def effects_of(event_id: str, obj: dict[str, Any], delivery_id: str) -> list[dict[str, Any]]:
    """The effects Orderly's pg reducer emits for a deposit's new status (app/core/pg.py), in its envelope."""
    dep, status = obj["id"], obj["status"]
    order = f"o_{dep}"

    def effect(dedupe_key: str, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        return {"dedupe_key": dedupe_key, "type": kind, "gateway": "pg", "resource_id": dep, "payload": payload,
                "caused_by": delivery_id}

    if status == "settled":
        amount = obj["amount_received_minor"]
        return [effect(f"deposit:{dep}:credit_user", "credit_user",
                       {"user_id": f"u_{dep}", "order_id": order, "amount_minor": amount}),
                effect(f"deposit:{dep}:release_goods", "release_goods",
                       {"order_id": order, "partial": False, "received": amount,
                        "ordered": obj["ordered_amount_minor"]})]
    return [effect(f"{event_id}:update_order_status", "update_order_status", {"order_id": order, "status": status})]


async def run_worker() -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from app.core.pacing import busy_pause
    from app.producer import KeyedProducer
    from app.seams.faust.consumer import FETCH_MAX_WAIT_MS
    from app.worker.consumer import BUSY_FETCH_MIN_BYTES
    from topics.records import H_DELIVERY_ID

    settings, n = _settings()
    producer = KeyedProducer(settings.kafka_bootstrap, linger_ms=0, **client_options(settings))
    await producer.start()
    # the fetch Orderly's worker makes when busy (app/worker/consumer.py), its offsets committed as often
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, group_id=f"{settings.namespace}-floor",
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                fetch_min_bytes=BUSY_FETCH_MIN_BYTES, fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
                                **client_options(settings))
    await consumer.start()
    partitions = await producer.producer.partitions_for(n.raw)
    consumer.assign([TopicPartition(n.raw, p) for p in partitions])
    versions: dict[bytes, int] = {}
    decided: dict[Any, int] = {}
    committed_at = time.monotonic()
    while True:
        fetched = await consumer.getmany(timeout_ms=100, max_records=settings.worker_batch_max)
        if not fetched:
            continue
        taken = time.monotonic()
        by_partition: dict[int, list[Any]] = {}
        for tp, records in fetched.items():
            outputs = by_partition.setdefault(tp.partition, [])
            changed: dict[bytes, bytes] = {}
            for record in records:
                event = orjson.loads(record.value)
                obj = event["data"]["object"]
                version = obj["version"]
                applied = version > versions.get(record.key, 0)
                delivery_id = dict(record.headers)[H_DELIVERY_ID].decode()
                if applied:
                    versions[record.key] = version
                    changed[record.key] = orjson.dumps({"version": version, "status": obj["status"]})
                decision = {"delivery_id": delivery_id, "event_id": event["id"],
                            "resource_id": obj["id"], "event_type": event["type"],
                            "received_at_ms": record.timestamp, "outcome": "applied" if applied else "stale",
                            "seq": version, "payload": orjson.Fragment(record.value),
                            "row": {column: obj.get(column) for column in ROW_FIELDS} if applied else None}
                outputs.append((n.decisions, record.key, orjson.dumps(decision)))
                for effect in effects_of(event["id"], obj, delivery_id) if applied else ():
                    outputs.append((n.effects, effect["dedupe_key"].encode(), orjson.dumps(effect)))
            for key, state in changed.items():  # the state topic for analysts, the changelog for recovery
                outputs.append((n.state, key, state))
                outputs.append((n.changelog, key, state))
        await (await producer.enqueue_partitioned(by_partition))
        decided.update({tp: records[-1].offset + 1 for tp, records in fetched.items()})
        if time.monotonic() - committed_at >= settings.worker_busy_commit_interval_s:
            await consumer.commit(decided)
            committed_at = time.monotonic()
        size = sum(len(records) for records in fetched.values())
        if pause := busy_pause(size, size, taken, time.monotonic(), settings.worker_busy_interval_s,
                               settings.worker_batch_max):
            await asyncio.sleep(pause)  # under load the next batch grows, as Orderly's worker's


# --- projector ----------------------------------------------------------------------------------------

ROW_FIELDS = ("id", "version", "status", "is_terminal", "late_slip_accepted_until", "ordered_amount_minor",
              "transferred_amount_minor", "amount_received_minor", "fee_total_minor", "credited_amount_minor")


class Decision(msgspec.Struct):
    """The floor's decision record: the body carried as its bytes (msgspec.Raw), as Orderly's is."""

    delivery_id: str
    event_id: str
    resource_id: str
    event_type: str
    received_at_ms: int
    outcome: str
    seq: int
    payload: msgspec.Raw
    row: dict[str, Any] | None


def deposit_args(row: dict[str, Any]) -> tuple[Any, ...]:
    """pg_deposits' columns (projections/sql.py's order) from the fields the floor carries."""
    return (row["id"], row["version"], row["status"], row["is_terminal"], row["late_slip_accepted_until"],
            row["ordered_amount_minor"], row["transferred_amount_minor"], row["amount_received_minor"],
            row["fee_total_minor"], row["credited_amount_minor"], None, None, None, None, f"o_{row['id']}",
            f"u_{row['id']}", None, None)  # the correlation's order and user (bench/e2e.py's)


class Effect(msgspec.Struct):
    dedupe_key: str
    type: str
    resource_id: str
    payload: msgspec.Raw
    caused_by: str


async def run_projector() -> None:
    import asyncpg
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from app.core.pacing import busy_pause
    from app.effects import EFFECTS
    from app.sink import BUSY_FETCH
    from projections import sql
    from projections.bulk import write

    settings, n = _settings()
    read_decision, read_effect = msgspec.json.Decoder(Decision).decode, msgspec.json.Decoder(Effect).decode
    read_amount = msgspec.json.Decoder(dict[str, Any]).decode
    conn = await asyncpg.connect(settings.postgres_dsn.reveal(), server_settings={"search_path": settings.namespace})
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False,
                                auto_offset_reset="earliest", fetch_min_bytes=BUSY_FETCH[0],
                                fetch_max_wait_ms=BUSY_FETCH[1], **client_options(settings))  # the sinks' busy fetch
    await consumer.start()
    topics = (n.decisions, n.effects)
    consumer.assign([TopicPartition(t, p) for t in topics for p in range(settings.partitions)])
    while True:
        fetched = await consumer.getmany(timeout_ms=100, max_records=SINK_RECORDS)
        if not fetched:
            continue
        taken = time.monotonic()
        decisions = [read_decision(r.value) for tp, rs in fetched.items() if tp.topic == n.decisions for r in rs]
        effects = [read_effect(r.value) for tp, rs in fetched.items() if tp.topic == n.effects for r in rs]
        async with conn.transaction():
            await write(conn, sql.WEBHOOK_EVENTS, [
                (d.delivery_id, "pg", d.event_id, d.resource_id, d.event_type,
                 datetime.fromtimestamp(d.received_at_ms / 1000, UTC), d.outcome, bytes(d.payload).decode(), d.seq,
                 None) for d in decisions])
            await write(conn, sql.UPSERT_ROW["pg_deposits"], [deposit_args(d.row) for d in decisions if d.row])
            credits = [(e, read_amount(e.payload)) for e in effects if e.type == "credit_user"]
            await write(conn, sql.LEDGER, [(e.dedupe_key, p["user_id"], p["amount_minor"], e.resource_id)
                                           for e, p in credits])
            await write(conn, EFFECTS, [(e.dedupe_key, e.type, "pg", e.resource_id, bytes(e.payload).decode(),
                                         e.caused_by) for e in effects])
            for topic in topics:
                ends = {tp.partition: rs[-1].offset + 1 for tp, rs in fetched.items() if tp.topic == topic}
                if ends:
                    await conn.execute(sql.UPSERT_OFFSETS, CONSUMER, topic, list(ends), list(ends.values()))
        size = sum(len(rs) for rs in fetched.values())
        if pause := busy_pause(size, size, taken, time.monotonic(), settings.sink_busy_interval_s, SINK_RECORDS):
            await asyncio.sleep(pause)  # as Orderly's sinks (app/sink.py run_once)


def _settings() -> Any:
    from app.settings import Settings
    from topics.catalog import names

    settings = Settings.from_env()
    return settings, names(settings.namespace)


# --- the run ------------------------------------------------------------------------------------------

WARM_DEPOSITS = 2000  # the floor's own warm-up, as Orderly's correlations and its 12 s before a run


def run_floor(kafka: Any, postgres: Any, work: Path, round_no: int) -> dict[str, Any]:
    from app.stack.process import spare_port, stop_process
    from bench import e2e
    from bench.stack import cpu_seconds, settle

    port = spare_port()
    settings, env = e2e.namespace(kafka, postgres, f"floor{round_no}")
    url = f"http://127.0.0.1:{port}"
    procs = {"ingest": e2e.serve([sys.executable, "-m", "bench.floor", "ingest", str(port)], env, port,
                                 work / f"floor-ingest-{round_no}.log")}
    for name in FLOOR_PROCESSES:
        with (work / f"floor-{name}-{round_no}.log").open("ab") as out:
            procs[name] = subprocess.Popen([sys.executable, "-m", "bench.floor", name], env=env, stdout=out,
                                           stderr=subprocess.STDOUT)

    def stored(result: dict[str, Any], count: int) -> int:
        if result["non_2xx"] or result["requests"] != count:
            raise RuntimeError(f"the floor stored {result['requests'] - result['non_2xx']} of {count} webhooks "
                               f"(logs in {work})")
        return count

    def projected(count: int) -> float:
        for _ in range(120):  # a second at a time, its processes checked in between
            dead = [name for name, proc in procs.items() if proc.poll() is not None]
            if dead:
                raise RuntimeError(f"the floor's {', '.join(dead)} exited (logs in {work})")
            try:
                return asyncio.run(e2e.wait_projected(settings, count, limit_s=1))
            except TimeoutError:
                continue
        raise RuntimeError(f"the floor did not project {count} webhooks in 120 s (logs in {work})")

    try:
        warm_file, requests_file = work / f"warm-floor-{round_no}.json", work / f"requests-floor-{round_no}.json"
        warm = stored(e2e.load(url, warm_file, e2e.write_requests(settings, warm_file, WARM_DEPOSITS, "warm")),
                      3 * WARM_DEPOSITS)
        projected(warm)
        count = e2e.write_requests(settings, requests_file)
        settle(postgres, settings.namespace)
        before = cpu_seconds(procs, kafka, postgres)
        result = e2e.load(url, requests_file, count)
        acked = stored(result, count)
        elapsed = projected(warm + acked) - result["started_at"]
        cpu = {k: round(v - before.get(k, 0.0), 2) for k, v in cpu_seconds(procs, kafka, postgres).items()}
    finally:
        for proc in procs.values():
            stop_process(proc, 30)
    cpu["load"] = round(result["cpu_s"], 2)
    return {"events": acked, "rate": acked / elapsed, "elapsed_s": elapsed, "cpu_s": cpu}


def main(argv: list[str] | None = None) -> None:
    """ROUNDS rounds, each on a broker and a PostgreSQL of its own: the floor and Orderly
    at-least-once on the same webhooks, which goes first turning each round. ``argv``: Orderly's
    builds or settings as named variants, bench ab's way (``'{"now": {}, "start": {"PYTHONPATH":
    "/tmp/start"}}'``); one build, the tree's, by default. Prints each run's rate and CPU seconds per
    1,000 webhooks per process, and each build's total against the floor's of the same round."""
    from bench import ab, e2e
    from bench.stack import embedded, save_results

    variants: dict[str, dict[str, str]] = orjson.loads(argv[0]) if argv else {"orderly": {}}
    designs = ["floor", *variants]
    rounds = int(ROUNDS) if ROUNDS else 2 * len(designs)
    if rounds % len(designs):
        print(f"BENCH_ROUNDS={rounds}: some designs go first more often than others", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {design: [] for design in designs}
    for round_no in range(rounds):
        with embedded("orderly-bench-floor-") as (work, kafka, postgres):
            for design in e2e.turned(designs, round_no):
                if design == "floor":
                    result = run_floor(kafka, postgres, work, round_no)
                else:
                    with ab.environment(variants[design]):  # a namespace of its own (bench ab's numbering)
                        result = e2e.run_pipeline(kafka, postgres, "at_least_once", work,
                                                  round_no * len(designs) + designs.index(design))
                    if result["events"] != 3 * e2e.DEPOSITS:  # every webhook stored, as the floor's
                        raise RuntimeError(f"{design} stored {result['events']} of {3 * e2e.DEPOSITS} webhooks")
                by_process = e2e.per_thousand_by_process(result)
                by_process.pop("load", None)
                runs[design].append({"rate": round(result["rate"]), "total": round(sum(by_process.values()), 3),
                                     "by_process": by_process})
                print(f"round {round_no + 1}: {design} {result['rate']:.0f} webhooks/s, "
                      f"{runs[design][-1]['total']:.3f} CPU-s per 1,000 webhooks: {by_process}", flush=True)
    first = ", ".join(e2e.turned(designs, k)[0] for k in range(rounds))
    print(f"\nfloor benchmark: {e2e.DEPOSITS} deposits x 3 signed webhooks, {e2e.CONCURRENCY} clients, "
          f"{os.cpu_count()} cores, {rounds} rounds (first in each: {first})")
    for design in designs:
        totals = [run["total"] for run in runs[design]]
        line = (f"  {design}: CPU-s per 1,000 webhooks {', '.join(f'{t:.3f}' for t in totals)} "
                f"(median {statistics.median(totals):.3f})")
        if design != "floor":
            ratios = [run["total"] / floor["total"] for run, floor in zip(runs[design], runs["floor"], strict=True)]
            line += f"; x the floor of its round {', '.join(f'{r:.2f}' for r in ratios)}"
        print(line)
    for name in sorted({name for run in runs[designs[-1]] for name in run["by_process"]}):
        medians = ", ".join(
            f"{design} {statistics.median(run['by_process'].get(name, 0.0) for run in runs[design]):.3f}"
            for design in designs)
        print(f"  {name:<10} median per 1,000: {medians}")
    save_results("floor", runs)


if __name__ == "__main__":
    from app.process_setup import tune_gc, use_event_loop

    floor_settings, _ = _settings()
    use_event_loop(floor_settings.event_loop)  # as every Orderly process
    tune_gc(floor_settings.gc_threshold)
    role = sys.argv[1]
    if role == "ingest":
        asyncio.run(run_ingest(int(sys.argv[2])))
    elif role == "worker":
        asyncio.run(run_worker())
    elif role == "projector":
        asyncio.run(run_projector())
