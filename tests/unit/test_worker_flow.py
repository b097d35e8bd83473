"""The worker app's fetch path against Faust's real conductor: WorkerApp installs its FlowControl
for every stream and changelog queue, and when Consumer.delivers_at_once says a hand-over cannot
wait, the conductor's compiled handler (Faust's Cython one when built) completes without suspending
— the fetch loop's direct call relies on that. A suspended flow makes it wait, and the check says so."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from faust.types import TP
from faust.types.tuples import Message

from app.seams.faust import Consumer, RawSchema, WorkerApp
from app.seams.mode import FlowControl

TP0 = TP("raw", 0)


def _setup() -> tuple[WorkerApp, Any, Any]:
    app = WorkerApp("flow-test", broker="kafka://127.0.0.1:1", store="memory://")
    topic = app.topic("raw", schema=RawSchema(key_type=bytes, value_type=bytes,
                                                key_serializer="raw", value_serializer="raw"))
    channel = topic.clone(is_iterator=True)
    conductor: Any = app.topics
    conductor._tp_index[TP0].add(channel)
    conductor._update_callback_map()
    return app, conductor, channel


def _message(offset: int) -> Message:
    return Message("raw", 0, offset, 0.0, 0, [], b"pg:dep_1", b"{}", None, tp=TP0, generation_id=1)


def _completes_at_once(coro: Any) -> bool:
    try:
        coro.send(None)
    except StopIteration:
        return True
    coro.close()
    return False


def test_the_worker_app_installs_its_flow_control_for_every_queue() -> None:
    async def run() -> None:
        app, _, channel = _setup()
        assert isinstance(app.flow_control, FlowControl)
        assert channel.queue._flow_control is app.flow_control
        tables: Any = app.tables
        assert tables.changelog_queue in app.flow_control._queues

    asyncio.run(run())


def test_a_direct_hand_over_completes_without_suspending() -> None:
    async def run() -> None:
        app, conductor, channel = _setup()
        consumer: Any = SimpleNamespace(app=app, suspend_flow=asyncio.Event())
        app.flow_control.resume()
        for offset in range(3):
            assert Consumer.delivers_at_once(consumer, TP0)
            assert _completes_at_once(conductor.on_message(_message(offset)))
            assert channel.queue.qsize() == offset + 1
        event = channel.queue.get_nowait()
        assert (event.key, event.value, event.message.offset) == (b"pg:dep_1", b"{}", 0)

        app.flow_control.suspend()  # a rebalance: the hand-over would wait, and the check knows it
        assert not Consumer.delivers_at_once(consumer, TP0)
        assert not _completes_at_once(conductor.on_message(_message(9)))

        app.flow_control.resume()  # back from the suspension: the old generation's records go
        assert channel.queue.qsize() == 0
        await conductor.on_message(_message(10))
        app.flow_control.resume()  # Faust's second resume after the seek keeps what came since
        assert channel.queue.qsize() == 1

    asyncio.run(run())
