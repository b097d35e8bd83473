"""The worker's source records handed over a fetch at a time, not through Faust's stream (seam layer
over faust-streaming 0.15.3 and mode-streaming 0.7.1).

Faust hands every record to its agent on its own: the fetch loop calls the conductor's callback
(faust/transport/conductor.py on_message: flow control, decode into an Event, a put on the
channel's queue), the stream takes it back off that queue (faust/_cython/streams.pyx
StreamIterator: the generation check, tracking, sensors, the current event), ``noack_take`` buffers
it through a stream processor, and the worker acks it alone (Stream.ack). Profiled under a backlog
(py-spy, ``bench worker``), that machinery was a quarter of the worker's main thread, more than
deciding the records.

Here the fetch loop (app/seams/faust/consumer.py) puts the source topic's records of each fetch on
one queue, in lists of at most HANDOVER_CHUNK, and the worker takes lists off it. What Faust's path does that matters is
kept, each where Faust does it:
- the queue is a FlowControlQueue managed by the app's flow control, so a rebalance clears it as it
  clears the channels' queues (app/seams/mode.py FlowControl);
- a record taken while the flow is off, or of another generation of the group than the consumer's
  now, is dropped as the stream drops it (streams.pyx _prepare_event);
- a record taken is tracked as unacked (Consumer._unacked_messages, transport/consumer.py line 483)
  until the worker acks it, so that Faust's revocation and stop wait for the batch that holds it
  (Consumer.wait_empty, line 867); the ack marks the partition as having news for Faust's commit
  (Consumer._acked, line 479, whose keys _filter_tps_with_pending_acks reads, line 1085);
- the topic is subscribed the way a stream subscribes it: by iterating its channel once
  (faust/topics.py Topic.__aiter__ adds the clone to the conductor, line 526).
Faust's sensors are not told of these records (the worker exports its own metrics), but for the
Monitor's stream_inbound_time, which Faust's check for a stalled stream reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from faust.types import TP, AppT, Message
from faust.types.tuples import ack_lock
from mode.utils.futures import notify
from mode.utils.queues import FlowControlQueue

# The fetch loop hands a fetch over in lists of at most HANDOVER_CHUNK records (a fetch may hold tens
# of thousands), and at most QUEUED_LISTS of them wait for the worker: about as many records as
# Faust's stream buffer held (stream_buffer_maxsize, 4,096), however far behind the worker is.
HANDOVER_CHUNK = 500
QUEUED_LISTS = 8


class Taken:
    """A record of the source topic as the worker takes it: its key and value, and the message
    (topic, partition, offset, headers) Faust's consumer made of it."""

    __slots__ = ("__weakref__", "message")  # weakly referenced as the current event (tables.inside)

    def __init__(self, message: Message) -> None:
        self.message = message

    @property
    def key(self) -> bytes | None:  # raw serialisers: the bytes as stored
        return self.message.key

    @property
    def value(self) -> bytes | None:
        return self.message.value


class Handover:
    """The queue between the fetch loop and the worker, for one source topic."""

    def __init__(self, app: AppT, topic: str, lists: int = QUEUED_LISTS) -> None:
        self.app = app
        self.topic = topic
        # clear_on_resume: the flow control clears it with the channels' queues (FlowControl.clear)
        self.queue: FlowControlQueue[list[Message]] = FlowControlQueue(
            maxsize=lists, flow_control=app.flow_control, clear_on_resume=True)
        self.carried: list[Message] = []  # taken off the queue, beyond the last take's limit

    def subscribe(self, channel: Any) -> None:
        """Subscribe the topic as a stream does, by iterating ``channel`` (the agent's stream's)."""
        aiter(channel)

    def ready(self) -> bool:
        """Whether the fetch loop may put a list without waiting."""
        return self.app.flow_control.is_active() and not self.queue.full()

    def put_nowait(self, messages: list[Message]) -> None:
        self.queue.put_nowait(messages)

    async def put(self, messages: list[Message]) -> None:
        """Put once the flow runs and Faust's producer buffer is under its limit (as the conductor's
        callback waits for both, conductor.py on_message) and there is room."""
        await self.app.flow_control.acquire()
        await self.app.producer.buffer.wait_until_ebb()
        await self.queue.put(messages)

    def queued(self) -> int:
        """Records fetched and not yet taken."""
        lists: Any = self.queue._queue  # type: ignore[attr-defined]  # asyncio.Queue's deque (mode's own clear() empties it)
        return len(self.carried) + sum(len(messages) for messages in lists)

    async def takes(self, batch_max: int, within: float) -> AsyncIterator[list[Taken]]:
        """Lists of at most ``batch_max`` records, in the order fetched: what is queued, and what more
        arrives while the take is short, until ``within`` seconds after the previous take ended (as
        Faust's noack_take times it: a record that comes to an idle worker later than that goes at once)."""
        loop = asyncio.get_running_loop()
        while True:
            deadline = loop.time() + within
            taken: list[Message] = self.carried or await self.queue.get()
            self.carried = []
            while len(taken) < batch_max:
                if not self.queue.empty():
                    taken.extend(self.queue.get_nowait())
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        taken.extend(await self.queue.get())
                except TimeoutError:
                    break
            # checked as the take ends, not as each list arrives: a rebalance may have come meanwhile
            taken = self._fresh(taken)
            if len(taken) > batch_max:
                taken, self.carried = taken[:batch_max], taken[batch_max:]
            if taken:
                yield self._track(taken)

    def _fresh(self, messages: list[Message]) -> list[Message]:
        """Without the records a stream would skip: the flow is off (a rebalance), or they were
        fetched in another generation of the group than the consumer's now."""
        app = self.app
        if not app.flow_control.is_active():
            return []
        generation = app.consumer_generation_id
        if all(message.generation_id == generation for message in messages):
            return messages
        return [message for message in messages if message.generation_id == generation]

    def _track(self, messages: list[Message]) -> list[Taken]:
        """Unacked from now on, until ``ack``: Faust's revocation and stop wait for them."""
        consumer: Any = self.app.consumer  # faust.transport.consumer.Consumer: its private bookkeeping
        unacked = consumer._unacked_messages
        for message in messages:
            message.tracked = True
            unacked.add(message)
        # what a stream's sensors record of its events: Faust's check for a stalled stream reads it
        # (faust/transport/drivers/aiokafka.py verify_event_path; sensors/monitor.py on_stream_event_in)
        inbound, now = self.app.monitor.stream_inbound_time, time.monotonic()
        for tp in {message.tp for message in messages}:
            inbound[tp] = now
        return [Taken(message) for message in messages]

    def ack(self, taken: Sequence[Taken]) -> None:
        """The records were decided: acked for Faust (Consumer.ack's bookkeeping, once per partition
        for the commit's list of partitions with news; the offsets committed are the worker's)."""
        consumer: Any = self.app.consumer
        unacked, acked = consumer._unacked_messages, consumer._acked
        seen: set[TP] = set()
        with ack_lock:
            for item in taken:
                message = item.message
                message.acked = True
                unacked.discard(message)
                seen.add(message.tp)
            for tp in seen:
                acked[tp]  # a defaultdict: the key is what Faust's commit looks for
            consumer._n_acked += len(taken)  # Faust's commit every broker_commit_every records
        notify(consumer._waiting_for_ack)
