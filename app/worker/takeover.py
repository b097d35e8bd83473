"""Exactly-once with static member ids: the transaction a worker lost for good left open, aborted by
the workers that take its partitions over, at once instead of at its timeout (I/O shell).

A worker with ``ORDERLY_WORKER_INSTANCE_ID`` commits all its partitions in one transaction under the
transactional id ``<app>-worker-<instance>`` (app/worker/app.py). Killed with a transaction open, it
leaves that transaction's changelog writes and offsets pending: the partitions' new owner cannot read
their committed offsets (UNSTABLE_OFFSET_COMMIT) nor restore the changelog past them (read_committed
stops at the open transaction) until the broker aborts it, TRANSACTION_TIMEOUT_S after it began plus
the broker's next scan. After each assignment a worker compares the group's static members with those
of the last one; for each instance gone, it asks the transaction coordinator for a producer id under
that instance's transactional id, which aborts the open transaction and fences its producer
(Kafka's InitProducerId: the zombie-fencing rule, KIP-98). A gone worker that comes back under its id
initialises its producer again and goes on; one that was only cut off is fenced, as its group already
expelled it. Nothing here is needed for correctness: the timeout aborts the transaction anyway.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from app.kafka_client import client_options
from app.settings import TRANSACTION_TIMEOUT_S, Settings
from app.waits import within

log = logging.getLogger("orderly.worker")
ASK_TIMEOUT_S = 10.0  # a describe or a fence that takes longer is dropped: the timeout still aborts
# Kafka names a static member `<group.instance.id>-<UUID>` (GroupMetadataManager): the instance is the rest
STATIC_MEMBER = re.compile(r"^(?P<instance>.+)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


# the states in which a group's member list is its members' (not Empty or Dead, as a group is
# described by a coordinator that lost it or is loading it)
MEMBERS_KNOWN = frozenset({"Stable", "CompletingRebalance", "PreparingRebalance"})


def instances(member_ids: Iterable[str]) -> set[str]:
    """The static instance ids named by a group's member ids."""
    return {m.group("instance") for member in member_ids if (m := STATIC_MEMBER.match(member))}


def gone(before: set[str] | None, error_code: int, state: str, member_ids: Iterable[str],
         own: str) -> tuple[set[str], set[str] | None]:
    """The instances to fence and the members to remember, from a description of the group. Nothing
    is gone unless the description is an answer about a group that holds this worker; this worker
    itself never is."""
    now = instances(member_ids)
    if error_code or state not in MEMBERS_KNOWN or own not in now:
        return set(), before  # no answer to go by: keep the last one
    return ((before or set()) - now) - {own}, now


def worker_transaction(group: str, instance: str) -> str:
    """The transactional id of the worker of static id ``instance`` in consumer group ``group``."""
    return f"{group}-worker-{instance}"


class Takeover:
    """Remembers the group's static members from one assignment to the next and aborts the open
    transaction of each one gone."""

    def __init__(self, settings: Settings, group: str, own: str) -> None:
        self.settings = settings
        self.group = group
        self.own = own  # this worker's instance id
        self.members: set[str] | None = None  # None before the first assignment read them
        # one admin client for the worker's life, connected at its start: at an assignment a worker
        # on a busy machine may be near its session's end, and a new client's connections and
        # metadata there had it expelled (bench restart, 3 s session); a describe costs a request
        self.admin: AIOKafkaAdminClient | None = None
        self.started: asyncio.Future[None] | None = None

    def start(self) -> None:
        """On the worker's loop, at its start (an aiokafka client belongs to the loop it was made on)."""
        self.admin = AIOKafkaAdminClient(bootstrap_servers=self.settings.kafka_bootstrap,
                                         **client_options(self.settings))
        self.started = asyncio.ensure_future(self.admin.start())

    async def close(self) -> None:
        if self.started is not None and self.admin is not None:
            self.started.cancel()
            await self.admin.close()

    async def after_assignment(self) -> set[str]:
        """The instances gone since the last assignment, each one's transaction aborted (or tried)."""
        try:
            error_code, state, member_ids = await within(self._described(), ASK_TIMEOUT_S)
        except Exception as exc:  # not readable: the transaction timeout will do it
            log.info("the group's members could not be read after an assignment (%r)", exc)
            return set()
        left, self.members = gone(self.members, error_code, state, member_ids, self.own)
        for instance in sorted(left):
            await self.abort_left_by(instance)
        return left

    async def abort_left_by(self, instance: str) -> None:
        txn = worker_transaction(self.group, instance)
        producer = AIOKafkaProducer(bootstrap_servers=self.settings.kafka_bootstrap, transactional_id=txn,
                                    transaction_timeout_ms=int(TRANSACTION_TIMEOUT_S * 1000),
                                    **client_options(self.settings))
        try:
            await within(producer.start(), ASK_TIMEOUT_S)  # InitProducerId aborts what is open
            log.warning("worker %s left the group: its open transaction, if any, was aborted and its producer "
                        "fenced (%s), so its partitions go on without waiting out the transaction timeout",
                        instance, txn)
        except Exception as exc:
            log.warning("worker %s left the group, but its transaction could not be aborted (%r): its "
                        "partitions wait for the broker to abort it", instance, exc)
        finally:
            await producer.stop()

    async def _described(self) -> tuple[int, str, list[str]]:
        """The group's error code, state and member ids, as its coordinator describes them."""
        if self.started is None or (self.started.done() and self.started.exception() is not None):
            self.start()  # not yet, or its start failed: a new client
        assert self.started is not None and self.admin is not None
        await asyncio.shield(self.started)
        [described] = await self.admin.describe_consumer_groups([self.group])
        [group] = described.groups
        error_code, _group_id, state, _protocol_type, _protocol, members, *_ = group
        return int(error_code), str(state), [str(member[0]) for member in members]
