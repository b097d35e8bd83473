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
  (FENCED_INSTANCE_ID); a worker of a release without this watch is never removed by it;
- a worker that stops cleanly says so last: it is left to its session (a static one restarted
  within it takes its partitions back without a rebalance; a dynamic one leaves by itself).
A live worker removed all the same (its process stopped longer than the setting, a VM paused) rejoins
as a new member: a static one then exits for its supervisor to restart it, as after a session
expiry. A restart, never a wrong decision. Only workers should be able to write the topic (an ACL):
a record naming a live member and then falling silent would have it removed.
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
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.kafka_client import client_options
from app.seams import aiokafka as kafka_seam
from app.seams import aiokafka_groups
from app.settings import Settings
from app.waits import within

log = logging.getLogger("orderly.worker")
ALIVE_EVERY_S = 0.25  # how often a worker appends its record
STEADY_MS = 1000  # a gap this long between a worker's own records is a pause of its view, not a peer's death
FORGET_MS = 60_000  # a peer silent this long (or ten times the setting) is forgotten
LOG_APPEND_TIME = 1  # a record's timestamp type: the broker's clock (the topic's message.timestamp.type)
MAX_RECORD_BYTES = 1024  # a larger record on the topic is not a worker's: ignored
MAX_PEERS = 1000  # workers remembered at once; records of further keys are ignored until some are forgotten
REMOVE_TIMEOUT_S = 2.0  # a removal that takes longer is tried again after the setting
STOP_WAIT_S = 5.0  # a stop waits this long for the thread to say so and end (a removal under way, its record)
RETRY_S = 1.0  # the watch's clients made again this long after they failed
READ_WAIT_MS = 250  # a read of the topic returns after this at the latest


@dataclass
class Peer:
    """What the last record of one worker said, and when the broker appended it (ms)."""

    member: str  # its member id in the group ('' before its first join)
    instance: str | None  # its static instance id (None: a dynamic member)
    heard: int  # when its last record was appended
    at: int  # from when its silence counts (``heard``, or later when this worker's own records paused)
    stopping: bool  # its last record said it stops cleanly: left to its session


class PeerView:
    """Which peers are lost, from the records of the workers topic read in their order (pure)."""

    def __init__(self, own_key: str, lost_after_ms: int) -> None:
        self.own_key = own_key
        self.lost_after_ms = lost_after_ms
        self.forget_ms = max(FORGET_MS, 10 * lost_after_ms)
        self.own_at: int | None = None  # the broker time of this worker's last record read
        self.peers: dict[str, Peer] = {}
        self.tried: dict[str, str] = {}  # key -> the member id removed (never twice)
        self.not_before: dict[str, int] = {}  # key -> own time before which a failed removal is not tried again

    def saw(self, key: str, member: str, instance: str | None, at: int, stopping: bool = False) -> None:
        if key == self.own_key:
            if self.own_at is not None and at - self.own_at > STEADY_MS:
                # this worker's own records paused: no peer's silence before now is evidence
                for peer in self.peers.values():
                    peer.at = max(peer.at, at)
            self.own_at = at if self.own_at is None else max(self.own_at, at)
            return
        if instance is not None and key != instance:
            return  # a static worker's records are keyed by its instance id: not a worker's record
        known = self.peers.get(key)
        if known is None and len(self.peers) >= MAX_PEERS:
            return  # a flood of keys (not workers: a group has as many as partitions, at most) stays bounded
        if member and (known is None or known.member != member) and self._claimed(member, key):
            return  # another key already speaks for this member: not its record
        if known is None or at >= known.heard:
            self.peers[key] = Peer(member, instance, at, at if known is None else max(at, known.at), stopping)

    def _claimed(self, member: str, key: str) -> bool:
        return any(peer.member == member and other != key for other, peer in self.peers.items())

    def lost(self) -> list[tuple[str, Peer]]:
        """The peers silent past the setting, each member id once; peers silent long past it forgotten."""
        if self.own_at is None:
            return []
        found = []
        for key, peer in list(self.peers.items()):
            silent = self.own_at - peer.at
            if silent > self.forget_ms:
                del self.peers[key]
                self.tried.pop(key, None)
                self.not_before.pop(key, None)
            elif (silent > self.lost_after_ms and peer.member and not peer.stopping
                  and self.tried.get(key) != peer.member and self.not_before.get(key, self.own_at - 1) < self.own_at):
                found.append((key, peer))
        return found

    def removing(self, key: str, member: str) -> None:
        self.tried[key] = member

    def failed(self, key: str) -> None:
        """A removal that failed is tried again after the setting, not at every look."""
        self.not_before[key] = (self.own_at or 0) + self.lost_after_ms


def parse(value: bytes | None, group: str) -> tuple[str, str | None, bool] | None:
    """A record's (member id, instance id, stopping), or None if it is not a record of ``group``'s workers."""
    if value is None or len(value) > MAX_RECORD_BYTES:
        return None
    try:
        body = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(body, dict) or body.get("group") != group:
        return None
    member, instance, stopping = body.get("member"), body.get("instance"), body.get("stopping", False)
    if not isinstance(member, str) or not (instance is None or isinstance(instance, str)) \
            or not isinstance(stopping, bool):
        return None
    return member, instance, stopping


class PeerWatch:
    """The thread that says this worker is alive and removes the workers that stopped saying it."""

    def __init__(self, settings: Settings, group: str, topic: str, consumer: Callable[[], Any],
                 removed: Callable[[str], None]) -> None:
        self.settings = settings
        self.group = group
        self.topic = topic
        self.instance = settings.worker_member
        self.key = self.instance or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.lost_after_ms = round(settings.worker_lost_after_s * 1000)
        self.view = PeerView(self.key, self.lost_after_ms)
        self.consumer = consumer  # aiokafka's consumer of the worker (None before it exists)
        self.removed = removed  # a removal's outcome, for the metric
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping = asyncio.Event()  # set through self.loop from the worker's thread
        self.said_stopping = False
        self.warned_clock = False
        self.can_remove = True
        self.own_seen = time.monotonic()  # when this worker last read one of its own records back
        self.warned_own = False

    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="orderly-peers", daemon=True)
        self.thread.start()

    def stop(self, timeout: float = STOP_WAIT_S) -> None:
        """Says this worker stops (it is then left to its session) and ends the thread."""
        if self.thread is None or self.loop is None or not self.thread.is_alive():
            return
        try:
            self.loop.call_soon_threadsafe(self.stopping.set)
        except RuntimeError:  # its loop just closed
            return
        self.thread.join(timeout)

    def _run(self) -> None:
        assert self.loop is not None
        try:
            while not self.stopping.is_set():
                try:
                    self.loop.run_until_complete(self._main())
                except BaseException as exc:  # nothing may end the watch silently: a live worker would look dead
                    log.error("the watch of the other workers was interrupted (%r); it starts again", exc)
        finally:
            self.loop.close()

    async def _main(self) -> None:
        """Sessions of the two clients, new ones after a failure, until the worker stops; then it says so."""
        while not self.stopping.is_set():
            try:
                await self._session()
            except Exception as exc:  # a speed-up: meanwhile the session still expels a lost worker
                log.warning("the watch of the other workers failed (%r); it starts again in %g s", exc, RETRY_S)
                await self._stopped_within(RETRY_S)
        if not self.said_stopping:  # stopped while its clients were away: a producer of its own for it
            producer = self._producer()
            try:
                await within(producer.start(), 2.0)
                await self._say_stopping(producer)
            except Exception as exc:
                log.info("the record that this worker stops was not sent (%r)", exc)
            finally:
                await producer.stop()

    async def _session(self) -> None:
        producer = self._producer()
        consumer = AIOKafkaConsumer(bootstrap_servers=self.settings.kafka_bootstrap, enable_auto_commit=False,
                                    fetch_max_wait_ms=100, **client_options(self.settings))
        alive: asyncio.Future[None] | None = None
        try:
            await within(asyncio.gather(producer.start(), consumer.start()), 10.0)
            log.info("watching the other workers on %s: one silent for %g s is removed from the group",
                     self.topic, self.lost_after_ms / 1000)
            alive = asyncio.ensure_future(self._say_alive(producer))
            tp = TopicPartition(self.topic, 0)
            consumer.assign([tp])
            await self._seek_back(consumer, tp)
            await self._watch(producer, consumer, tp)
            alive.cancel()
            await self._say_stopping(producer)
        finally:
            if alive is not None:
                alive.cancel()
            await asyncio.gather(producer.stop(), consumer.stop(), return_exceptions=True)

    def _producer(self) -> AIOKafkaProducer:
        # a request stuck on one connection must not silence this worker for the others: retried soon
        return AIOKafkaProducer(bootstrap_servers=self.settings.kafka_bootstrap, linger_ms=0, acks=1,
                                request_timeout_ms=max(1000, self.lost_after_ms // 3), **client_options(self.settings))

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
        try:
            await within(self.stopping.wait(), seconds)
        except TimeoutError:
            return False
        return True

    def _record(self, stopping: bool = False) -> bytes:
        # the member id at each record (a worker that joined and died before its first assignment too)
        body = {"group": self.group, "member": kafka_seam.member_id(self.consumer()) or "", "instance": self.instance}
        return orjson.dumps({**body, "stopping": True} if stopping else body)

    async def _say_alive(self, producer: AIOKafkaProducer) -> None:
        key = self.key.encode()
        while True:
            try:
                await producer.send(self.topic, self._record(), key=key, partition=0)  # queued, not awaited
            except Exception as exc:
                log.info("alive record not sent: %r", exc)
            await asyncio.sleep(ALIVE_EVERY_S)

    async def _say_stopping(self, producer: AIOKafkaProducer) -> None:
        try:
            await within(producer.send_and_wait(self.topic, self._record(stopping=True), key=self.key.encode(),
                                                partition=0), 2.0)
            self.said_stopping = True
        except Exception as exc:  # the others then remove it after the setting, as a lost one
            log.info("the record that this worker stops was not sent (%r)", exc)

    async def _watch(self, producer: AIOKafkaProducer, consumer: AIOKafkaConsumer, tp: TopicPartition) -> None:
        while not self.stopping.is_set():
            batches = await consumer.getmany(tp, timeout_ms=READ_WAIT_MS)
            own_before = self.view.own_at
            for record in batches.get(tp, []):
                self._read(record.key, record.value, record.timestamp, record.timestamp_type)
            self._check_own(own_before)
            for key, peer in self.view.lost() if self.can_remove else []:
                if self.stopping.is_set():
                    break
                await self._remove(producer, key, peer)

    def _check_own(self, before: int | None) -> None:
        """A worker that does not read its own records back may be removed by the others: said once."""
        now = time.monotonic()
        if self.view.own_at != before:
            self.own_seen, self.warned_own = now, False
        elif not self.warned_own and now - self.own_seen > self.lost_after_ms / 1000:
            self.warned_own = True
            log.warning("this worker has not read its own alive record on %s for %.1f s: the other workers may "
                        "remove it from the group (it then joins again)", self.topic, now - self.own_seen)

    def _read(self, key: bytes | None, value: bytes | None, at: int, timestamp_type: int) -> None:
        said = parse(value, self.group)
        if key is None or said is None:
            return
        if timestamp_type != LOG_APPEND_TIME:  # producers' clocks are not one clock: no judgement from them
            if not self.warned_clock:
                self.warned_clock = True
                log.warning("topic %s does not stamp records with the broker's time: lost workers are left to "
                            "their session; set its message.timestamp.type=LogAppendTime (kafka-configs --alter) "
                            "or delete it for the next start to create it (docs/production.md#scaling-out)",
                            self.topic)
            return
        self.view.saw(key.decode("utf-8", "replace"), *said[:2], at, said[2])

    async def _remove(self, producer: AIOKafkaProducer, key: str, peer: Peer) -> None:
        silent = (self.view.own_at or peer.heard) - peer.heard  # since its last record, as said in the log
        generation = kafka_seam.group_membership(self.consumer()).generation
        try:
            answers = await within(aiokafka_groups.remove_members(producer.client, self.group,
                                                                   [(peer.member, peer.instance)]), REMOVE_TIMEOUT_S)
        except aiokafka_groups.UNSUPPORTED as exc:
            self.can_remove = False
            log.error("the brokers do not take LeaveGroup version 3 (Kafka 2.4+) (%r): lost workers are left to "
                      "their session", exc)
            return
        except Exception as exc:  # tried again after the setting
            log.warning("worker %s has said nothing for %.1f s, but removing it from group %s failed (%r)",
                        key, silent / 1000, self.group, exc)
            self.view.failed(key)
            self.removed("failed")
            return
        self.view.removing(key, peer.member)
        error = next(iter(answers.values()), None)
        if error == 0:
            log.warning("worker %s (member %s) has said nothing for %.1f s: removed from group %s, so that its "
                        "partitions move now rather than when its session (%g s) ends", key, peer.member,
                        silent / 1000, self.group, self.settings.session_timeout_s)
            self.removed("removed")
            kafka_seam.request_rejoin(self.consumer(), generation)  # the rebalance now, not at a heartbeat
            return
        log.info("worker %s has said nothing for %.1f s and is no longer member %s of group %s (error %s)",
                 key, silent / 1000, peer.member, self.group, error)
        self.removed("not_a_member")
        if error == aiokafka_groups.UNKNOWN_MEMBER_ID and silent < self.settings.session_timeout_s * 1000:
            kafka_seam.request_rejoin(self.consumer(), generation)  # another worker removed it just now
