"""Workers watch each other: one lost for good (kill -9, its machine gone) is removed from the
group by the others within ORDERLY_WORKER_LOST_AFTER_MS, not at its session's end (I/O shell, and
the pure ``PeerView`` it decides with).

The group coordinator expels a member that stopped heartbeating only after the session
(ORDERLY_SESSION_TIMEOUT_MS, 10 s by default; brokers refuse one under their
group.min.session.timeout.ms, 6 s by default), and a static member does not even leave on a clean
stop. So every worker also says it is alive: a thread of its own appends a small record to the
namespace's ``workers`` topic every ALIVE_EVERY_S (one partition, the broker's LogAppendTime) and
reads every worker's records there. A worker whose records stopped for ORDERLY_WORKER_LOST_AFTER_MS
while this worker's own kept arriving is removed from the group by its member id (LeaveGroup v3,
app/seams/aiokafka_groups.py; Kafka's Admin.removeMembersFromConsumerGroup), and this worker joins again at
once: the rebalance gives the lost one's partitions to the workers still there (with exactly-once,
takeover.py then aborts its open transaction).

What keeps a live worker in:
- its records come from a thread, not from the event loop a long batch or a recovery may hold;
- silence is measured on the broker's clock, between records of one partition: reading its own
  record, a worker has read everything appended before it;
- a pause of this worker's own records (this process starved, the partition's leader moving) counts
  for nobody: every peer's silence starts again where its own records resume;
- only a member id a worker published itself is removed: a worker restarted under its static id
  joins under a new one, which the coordinator will not let a stale removal touch
  (FENCED_INSTANCE_ID); a worker of a release without this watch is never removed by it.
A live worker removed all the same (its process stopped longer than the setting, a VM paused) finds
itself a new member at its next join and exits for its supervisor to restart it, as after a session
expiry: a restart, never a wrong decision.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.kafka_client import client_options
from app.seams import aiokafka_groups
from app.settings import Settings
from app.waits import within

log = logging.getLogger("orderly.worker")
ALIVE_EVERY_S = 0.25  # how often a worker appends its record
STEADY_MS = 1000  # a gap this long between a worker's own records is a pause of its view, not a peer's death
FORGET_MS = 60_000  # a peer silent this long is forgotten (removed or gone long ago)
LOG_APPEND_TIME = 1  # a record's timestamp type: the broker's clock (the topic's message.timestamp.type)
MAX_RECORD_BYTES = 1024  # a larger record on the topic is not a worker's: ignored
REMOVE_TIMEOUT_S = 5.0  # a removal that takes longer is tried again at the next look
START_RETRY_S = 2.0  # the clients' start tried again this often while Kafka does not answer


@dataclass
class Peer:
    """What the last record of one worker said, and when the broker appended it (ms)."""

    member: str  # its member id in the group ('' before its first join)
    instance: str | None  # its static instance id (None: a dynamic member)
    at: int


class PeerView:
    """Which peers are lost, from the records of the workers topic read in their order (pure)."""

    def __init__(self, own_key: str, lost_after_ms: int) -> None:
        self.own_key = own_key
        self.lost_after_ms = lost_after_ms
        self.own_at: int | None = None  # the broker time of this worker's last record read
        self.peers: dict[str, Peer] = {}
        self.tried: dict[str, str] = {}  # key -> the member id removed (never twice)

    def saw(self, key: str, member: str, instance: str | None, at: int) -> None:
        if key == self.own_key:
            if self.own_at is not None and at - self.own_at > STEADY_MS:
                # this worker's own records paused: no peer's silence before now is evidence
                for peer in self.peers.values():
                    peer.at = max(peer.at, at)
            self.own_at = at if self.own_at is None else max(self.own_at, at)
            return
        known = self.peers.get(key)
        if known is None or at >= known.at:
            self.peers[key] = Peer(member, instance, at)

    def lost(self) -> list[tuple[str, Peer]]:
        """The peers silent past the setting, each member id once; peers silent long past it forgotten."""
        if self.own_at is None:
            return []
        found = []
        for key, peer in list(self.peers.items()):
            silent = self.own_at - peer.at
            if silent > FORGET_MS:
                del self.peers[key]
                self.tried.pop(key, None)
            elif silent > self.lost_after_ms and peer.member and self.tried.get(key) != peer.member:
                found.append((key, peer))
        return found

    def removing(self, key: str, member: str) -> None:
        self.tried[key] = member


def parse(value: bytes | None, group: str) -> tuple[str, str | None] | None:
    """A record's (member id, instance id), or None if it is not a record of ``group``'s workers."""
    if value is None or len(value) > MAX_RECORD_BYTES:
        return None
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or body.get("group") != group:
        return None
    member, instance = body.get("member"), body.get("instance")
    if not isinstance(member, str) or not (instance is None or isinstance(instance, str)):
        return None
    return member, instance


class PeerWatch:
    """The thread that says this worker is alive and removes the workers that stopped saying it."""

    def __init__(self, settings: Settings, group: str, topic: str, on_removed: Callable[[], None],
                 removed: Callable[[str], None]) -> None:
        self.settings = settings
        self.group = group
        self.topic = topic
        self.instance = settings.worker_member
        self.key = self.instance or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.view = PeerView(self.key, round(settings.worker_lost_after_s * 1000))
        self.member = ""  # set by the worker's loop at each assignment
        self.on_removed = on_removed  # called from this thread after a removal (the worker rejoins)
        self.removed = removed  # a removal's outcome, for the metric
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping: asyncio.Event | None = None
        self.warned_clock = False

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="orderly-peers", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = 3.0) -> None:
        if self.loop is not None and self.stopping is not None:
            self.loop.call_soon_threadsafe(self.stopping.set)
        if self.thread is not None:
            self.thread.join(timeout)

    def _run(self) -> None:
        loop = self.loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._main())
        except Exception:  # the watch is a speed-up: the session still expels a lost worker
            log.exception("the watch of the other workers ended; a lost worker's partitions wait for the session")
        finally:
            loop.close()

    async def _main(self) -> None:
        self.stopping = asyncio.Event()
        options = client_options(self.settings)
        producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka_bootstrap, linger_ms=0, acks=1, **options)
        consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap, enable_auto_commit=False,
                                    fetch_max_wait_ms=100, **options)
        try:
            while not await self._started(producer, consumer):
                if await self._stopped_within(START_RETRY_S):
                    return
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            await self._seek_back(consumer, tp)
            alive = asyncio.ensure_future(self._say_alive(producer))
            try:
                await self._watch(producer, consumer, tp)
            finally:
                alive.cancel()
        finally:
            await asyncio.gather(producer.stop(), consumer.stop(), return_exceptions=True)

    async def _started(self, producer: AIOKafkaProducer, consumer: AIOKafkaConsumer) -> bool:
        try:
            await within(asyncio.gather(producer.start(), consumer.start()), 10.0)
            return True
        except Exception as exc:
            log.info("the watch of the other workers waits for Kafka (%r)", exc)
            return False

    @staticmethod
    async def _seek_back(consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
        """To the records of the last FORGET_MS: a worker that starts after another one died (the
        one it would have replaced, say) still knows that one's member id and when it fell silent."""
        found = await consumer.offsets_for_times({tp: int(time.time() * 1000) - FORGET_MS})
        at = found.get(tp)
        if at is None:
            await consumer.seek_to_end(tp)
        else:
            consumer.seek(tp, at.offset)

    async def _stopped_within(self, seconds: float) -> bool:
        assert self.stopping is not None
        try:
            await within(self.stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True

    async def _say_alive(self, producer: AIOKafkaProducer) -> None:
        key = self.key.encode()
        while True:
            value = orjson.dumps({"group": self.group, "member": self.member, "instance": self.instance})
            try:
                await producer.send(self.topic, value, key=key, partition=0)  # queued; not awaited further
            except Exception as exc:
                log.debug("alive record not sent: %r", exc)
            await asyncio.sleep(ALIVE_EVERY_S)

    async def _watch(self, producer: AIOKafkaProducer, consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
        assert self.stopping is not None
        while not self.stopping.is_set():
            batches = await consumer.getmany(tp, timeout_ms=500)
            for record in batches.get(tp, []):
                self._read(record.key, record.value, record.timestamp, record.timestamp_type)
            for key, peer in self.view.lost():
                await self._remove(producer, key, peer)

    def _read(self, key: bytes | None, value: bytes | None, at: int, timestamp_type: int) -> None:
        said = parse(value, self.group)
        if key is None or said is None:
            return
        if timestamp_type != LOG_APPEND_TIME:  # producers' clocks are not one clock: no judgement from them
            if not self.warned_clock:
                self.warned_clock = True
                log.warning("topic %s does not stamp records with the broker's time (message.timestamp.type="
                            "LogAppendTime): lost workers are not removed before their session ends; run "
                            "`orderly topics` to set it (docs/production.md#scaling-out)", self.topic)
            return
        self.view.saw(key.decode("utf-8", "replace"), *said, at)

    async def _remove(self, producer: AIOKafkaProducer, key: str, peer: Peer) -> None:
        silent = (self.view.own_at or peer.at) - peer.at
        try:
            answers = await within(aiokafka_groups.remove_members(producer.client, self.group,
                                                             [(peer.member, peer.instance)]), REMOVE_TIMEOUT_S)
        except Exception as exc:  # tried again at the next look
            log.warning("worker %s has said nothing for %.1f s, but removing it from group %s failed (%r)",
                        key, silent / 1000, self.group, exc)
            self.removed("failed")
            return
        self.view.removing(key, peer.member)
        error = next(iter(answers.values()), None)
        if error == 0:
            log.warning("worker %s (member %s) has said nothing for %.1f s: removed from group %s, so that its "
                        "partitions move now rather than when its session (%g s) ends", key, peer.member,
                        silent / 1000, self.group, self.settings.session_timeout_s)
            self.removed("removed")
            self.on_removed()
        else:  # gone already (a clean leave, another worker removed it) or back under a new member id
            log.info("worker %s has said nothing for %.1f s and is no longer member %s of group %s (error %s)",
                     key, silent / 1000, peer.member, self.group, error)
            self.removed("not_a_member")
