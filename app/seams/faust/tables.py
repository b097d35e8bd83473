"""Faust's table start and local store as the worker uses them: recovery without the fixed waits,
ending on the highwaters the worker reads, and the store's per-partition databases (seam layer).

Paths and line numbers are of faust-streaming 0.15.3 (app/seams/__init__.py pins it;
tests/unit/test_seams_faust.py checks that each private member relied on is still there).
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections import Counter
from collections.abc import Iterator
from typing import Any

from faust.streams import _current_event
from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP

from app.seams.faust.app import hooks_of


class ExactRecovery(Recovery):
    async def _build_highwaters(self, consumer: Any, tps: set[TP], destination: Counter[TP], title: str) -> None:
        """faust/tables/recovery.py Recovery._build_highwaters (line 669) fills ``destination`` (its
        active_highwaters or standby_highwaters) with each changelog partition's last offset; with
        exactly-once the worker reads them (its hooks' highwaters)."""
        hooks = hooks_of(self.app)
        # at-least-once: the log's end offset, as Faust reads it, is exact
        if hooks is None or not self.app.in_transaction:
            await super()._build_highwaters(consumer, tps, destination, title)
            return
        # the offsets the local stores hold (Faust set them from the stores for this assignment)
        held = self.active_offsets if destination is self.active_highwaters else self.standby_offsets
        highwaters = await hooks.highwaters(
            tps, {tp: held.get(tp) for tp in tps},
            # active partitions only: a standby's changelog is a live worker's, always in a transaction
            active=destination is self.active_highwaters,
            faust_timeout_s=float(self.app.conf.broker_request_timeout), title=title)
        self.log.info("Highwater for %s changelog partitions (last committed records): %s", title,
                      ", ".join(f"{tp.topic}[{tp.partition}]={offset}" for tp, offset in sorted(highwaters.items())))
        destination.clear()
        destination.update(highwaters)


class WorkerTableManager(TableManager):
    async def on_start(self) -> None:
        """faust/tables/manager.py TableManager.on_start (line 138) sleeps a second for tables to be
        registered; the worker registers its one table before the app starts."""
        if not self.should_stop:
            await self._update_channels()  # TableManager._update_channels (line 154)
            await self.recovery.start()

    @property
    def recovery(self) -> Recovery:
        # TableManager.recovery (line 119) makes its Recovery into _recovery (a class attribute, line 42) on first use
        if self._recovery is None:
            self._recovery = ExactRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


def partition_db(store: Any, partition: int) -> Any:
    """The RocksDB (rocksdict Rdict) of one partition of Faust's RocksDB store:
    faust/stores/rocksdb.py Store._db_for_partition (line 482)."""
    return store._db_for_partition(partition)


def is_rocksdict(store: Any) -> bool:
    """Whether ``store`` is Faust's RocksDB store on the rocksdict driver (Store.use_rocksdict, set
    in its __init__, line 276)."""
    return bool(getattr(store, "use_rocksdict", False))


class PartitionEvent:
    """Stands for an event of ``partition`` where Faust's store asks the current event which
    partition's database to use."""

    def __init__(self, partition: int) -> None:
        self.message = types.SimpleNamespace(partition=partition)


@contextlib.contextmanager
def inside(event: Any) -> Iterator[None]:
    """Read or write the table as if inside ``event``'s iteration: Faust's RocksDB store uses the
    current event's partition (without one, a read of a new key looks in every partition's
    database). Only this task's context variable is touched: changing the stream's own current
    event instead would make take_events() buffer the wrong event for a record that arrives
    meanwhile (seen here as one record processed twice and the next one lost).
    faust/streams.py _current_event (line 77), which faust.current_event() reads."""
    token = _current_event.set(weakref.ref(event))
    try:
        yield
    finally:
        _current_event.reset(token)
