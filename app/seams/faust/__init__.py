"""The door to faust-streaming 0.15.3's internals (seam layer): the worker's app and its hooks
(app.py), consumer (consumer.py), transactional producers (producer.py), table start and store
(tables.py), and the transport that makes Faust build them.

Every private member of Faust the worker relies on is read, written or overridden in this
package, with the file and line of the pinned version it relies on; tests/unit/test_seams_faust.py
fails when one of them is gone or changed its signature.
"""

from __future__ import annotations

from faust.transport.drivers import aiokafka as faust_aiokafka

from app.seams.faust.app import (
    CommittingConsumer,
    RawSchema,
    WorkerApp,
    WorkerHooks,
    hooks_of,
    raw_schema,
    worker_transactional_id,
)
from app.seams.faust.consumer import Consumer, ConsumerThread, ask_start_offset, consumer_of
from app.seams.faust.handover import Handover, Taken
from app.seams.faust.producer import Producer, Target, TransactionManager, producer_of, transactional_id
from app.seams.faust.tables import PartitionEvent, WorkerTableManager, inside, is_rocksdict, partition_db


class Transport(faust_aiokafka.Transport):
    """Faust's aiokafka transport, building the seam's consumer, producer and transaction manager
    (faust/transport/drivers/aiokafka.py Transport: its Consumer, Producer and TransactionManager
    class attributes are what it instantiates)."""

    Consumer = Consumer
    Producer = Producer
    TransactionManager = TransactionManager


__all__ = [
    "CommittingConsumer",
    "Consumer",
    "ConsumerThread",
    "Handover",
    "PartitionEvent",
    "Producer",
    "RawSchema",
    "Taken",
    "Target",
    "TransactionManager",
    "Transport",
    "WorkerApp",
    "WorkerHooks",
    "WorkerTableManager",
    "ask_start_offset",
    "consumer_of",
    "hooks_of",
    "inside",
    "is_rocksdict",
    "partition_db",
    "producer_of",
    "raw_schema",
    "transactional_id",
    "worker_transactional_id",
]
